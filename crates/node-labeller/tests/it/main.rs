//! The node labeller's labels from the sysfs fixtures, and the patch that keeps them
//! current.

mod labels;
