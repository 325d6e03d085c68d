//! hami-apiserver's integration tests, one binary: real clients (kube-rs, every kubectl on
//! the machine, raw HTTP and protobuf bodies) against the embedded server: CRUD, selectors,
//! paging and watches (`kube_client`, `watch`, `kubectl`, `protobuf`), quantities stored in canonical form
//! (`quantities`), `resource.k8s.io/v1`
//! (`resource_v1`), mutating admission through a real HTTPS webhook (`admission`), RBAC
//! and authentication (`rbac`), evictions against PodDisruptionBudgets (`eviction`), refused writes (`strict_writes`), slow clients
//! (`slow_clients`), HTTPS with its own CA (`tls`), service-account controllers, admission and pod-bound tokens (`service_accounts`), persistence and the `serve` entry point (`lifecycle`), bounded state
//! under churn (`bounded_state`), and the matchConditions evaluator against cel-python
//! (`cel_peer`). Each test starts its own server; they share nothing but this process.

mod common;

mod admission;
mod bounded_state;
mod cel_peer;
mod eviction;
mod kube_client;
mod kubectl;
mod lifecycle;
mod protobuf;
mod quantities;
mod rbac;
mod resource_v1;
mod service_accounts;
mod slow_clients;
mod strict_writes;
mod tls;
mod watch;
