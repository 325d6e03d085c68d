//! The planner's integration tests, one binary: properties of plans over random fleets and
//! workloads (`engine_props`), and `hami plan`'s `run` on the example scenario and on bad
//! scenario files (`plan_small`).

mod engine_props;
mod plan_small;
