//! The planner's integration tests, one binary: properties of plans over random fleets and
//! workloads (`engine_props`), and `hami plan`'s `run` on the example scenario and on bad
//! scenario files (`plan_small`); priority preemption in a plan and its
//! bad fields (`preemption`).

mod engine_props;
mod plan_small;
mod preemption;
