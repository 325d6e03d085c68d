//! Why a plan could not be made. Every variant is something the user must fix in the
//! scenario file or the flags (the CLI exits with status 2), except [`PlanError::Fixture`],
//! which is the machine failing to build a capture's sysfs tree (exit 1).

/// A plan that could not be made, with the field at fault and what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The scenario file could not be read.
    #[error("cannot read scenario {path}: {problem}")]
    Read { path: String, problem: String },
    /// The text is not YAML (or JSON) at all.
    #[error("scenario {path} is not valid YAML: {problem}")]
    Yaml { path: String, problem: String },
    /// A field is missing, unknown or has a bad value; `field` is its path, e.g.
    /// `fleet[1].count`.
    #[error("scenario {path}: {field}: {problem}")]
    Field {
        path: String,
        field: String,
        problem: String,
    },
    /// A flag has a bad value.
    #[error("{flag}: {problem}")]
    Flag { flag: &'static str, problem: String },
    /// A capture's sysfs tree could not be built or discovered (not the user's fault).
    #[error("capture {capture}: {problem}")]
    Fixture { capture: String, problem: String },
}

impl PlanError {
    /// The exit status the CLI should use: 2 for input the user must fix, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            PlanError::Fixture { .. } => 1,
            _ => 2,
        }
    }
}
