//! The CEL selectors this driver's classes and the webhook write, read as a conjunction
//! (`&&`) of these terms:
//! - `device.driver == "<d>"`;
//! - `device.attributes["<domain>"].<name> == <lit>` (string, int or bool literal);
//! - `device.attributes["<domain>"].<name> in [<lit>, ...]` (literals of one type, as
//!   Kubernetes' CEL environment requires homogeneous list literals);
//! - `device.capacity["<domain>"].<name>.compareTo(quantity("<q>")) <op> 0`, `<op>` one of
//!   `==`, `<`, `>`, `<=`, `>=` (the capacity is a Kubernetes quantity);
//! - `!(<term>)`, the negation of any of these.
//!
//! That is what the allocator model evaluates; any other CEL is refused with an error that
//! names it (the real kube-scheduler evaluates full CEL; our stand-in does not pretend to).
//! Evaluation follows upstream's: a lookup of an attribute or capacity the device lacks is a
//! runtime error (upstream: "any reference to an unknown field will cause an evaluation error
//! and allocation to abort"), `&&` is CEL's (false wins over an error, an error over true),
//! and `!` of an error is an error.
//!
//! Hand-written rather than a CEL library (none is a workspace dependency): only the
//! selectors this driver writes are read, and a full evaluator would accept expressions the
//! allocator model could not mirror. Quantity literals are whole numbers with an optional
//! suffix ([`hami_dra_core::quantity`]); a fraction (`1.5Gi`, valid upstream) is refused by name.

use std::cmp::Ordering;

use hami_dra_core::api::DeviceAttribute;

mod eval;
mod lex;
mod parse;
mod render;
#[cfg(test)]
mod tests;

pub use eval::eval;
pub use parse::{MAX_NEGATION_DEPTH, parse};
pub use render::render;

/// How a capacity compares to a quantity literal (`compareTo(...) <op> 0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmp {
    /// `== 0`.
    Eq,
    /// `< 0`.
    Lt,
    /// `> 0`.
    Gt,
    /// `<= 0`.
    Le,
    /// `>= 0`.
    Ge,
}

impl Cmp {
    fn holds(self, o: Ordering) -> bool {
        match self {
            Cmp::Eq => o.is_eq(),
            Cmp::Lt => o.is_lt(),
            Cmp::Gt => o.is_gt(),
            Cmp::Le => o.is_le(),
            Cmp::Ge => o.is_ge(),
        }
    }
    fn text(self) -> &'static str {
        match self {
            Cmp::Eq => "==",
            Cmp::Lt => "<",
            Cmp::Gt => ">",
            Cmp::Le => "<=",
            Cmp::Ge => ">=",
        }
    }
}

/// One conjunct of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Term {
    /// `device.driver == "<d>"`.
    Driver(String),
    /// Fully qualified attribute name (`<domain>/<name>`) equals the value.
    Attribute {
        /// `<domain>/<name>`.
        name: String,
        /// The literal it must equal.
        value: DeviceAttribute,
    },
    /// Fully qualified attribute name is one of the values.
    AttributeIn {
        /// `<domain>/<name>`.
        name: String,
        /// The list literal (one type).
        values: Vec<DeviceAttribute>,
    },
    /// Fully qualified capacity name compared to a quantity.
    Capacity {
        /// `<domain>/<name>`.
        name: String,
        /// The comparison with `compareTo`'s result.
        cmp: Cmp,
        /// The quantity literal as written.
        quantity: String,
        /// Its value.
        value: u64,
    },
    /// `!(<term>)`.
    Not(Box<Term>),
}

/// A selector this model cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "selector {expression:?}: {problem}; supported: `device.driver == \"…\"`, `device.attributes[\"<domain>\"].<name> == <string|int|bool>`, `device.attributes[\"<domain>\"].<name> in [<literals of one type>]`, `device.capacity[\"<domain>\"].<name>.compareTo(quantity(\"<q>\")) <==|<|>|<=|>=> 0` and `!(<one of these>)`, joined by &&"
)]
pub struct SelectorError {
    /// The expression.
    pub expression: String,
    /// What is not supported in it.
    pub problem: String,
}
