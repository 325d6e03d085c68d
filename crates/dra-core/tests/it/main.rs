//! hami-dra-core's integration tests, one binary: Prepare planning (`prepare`) and
//! ResourceSlices (`slices`) over the real sysfs captures, and upstream-shaped
//! `resource.k8s.io/v1` objects round-tripped through our types (`upstream_json`).

mod prepare;
mod slices;
mod upstream_json;
