//! hami-defrag-core's tests over real card shapes, and its properties.

mod fixtures;
mod fleet100;
mod measure;
mod plan;
mod planned;
mod props;
mod reserved;
mod scenarios;
mod score;
mod state;
