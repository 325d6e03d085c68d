//! hami-defrag-core's tests over real card shapes, and its properties.

mod fixtures;
mod measure;
mod plan;
mod props;
mod state;
