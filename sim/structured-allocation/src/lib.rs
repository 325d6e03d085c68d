//! A stand-in, not product code (issue 28): a model of kube-scheduler's structured DRA
//! allocator (`allocator`) and the CEL selector subset it evaluates (`selector`), over
//! `hami-dra-core`'s `resource.k8s.io/v1` types. The simulated kube-scheduler
//! (`sim/kube-scheduler-sim`) allocates claims with it; the fuzz checks read the webhook's
//! selectors with it. The driver itself never allocates: the real kube-scheduler does.
#![forbid(unsafe_code)]

pub mod allocator;
pub mod selector;
