//! Every wire format of hami-rs, as pure functions over plain data.

pub mod memory_limit;
