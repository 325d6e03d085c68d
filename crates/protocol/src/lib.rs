//! Every wire format of hami-rs, as pure functions over plain data.

pub mod cu_list;
pub mod device_list;
pub mod identity;
pub mod memory_limit;
pub mod names;
pub mod node_lock;
pub mod rfc3339;
