//! Why a plan could not be made. Every variant is something the user must fix in the
//! scenario file or the flags (the CLI exits with status 2), except [`PlanError::Fixture`],
//! which is the machine failing to build a capture's sysfs tree (exit 1).

/// A plan that could not be made, with the field at fault and what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The scenario file could not be read.
    #[error("cannot read scenario {path}: {problem}")]
    Read {
        /// The scenario file.
        path: String,
        /// The I/O error.
        problem: String,
    },
    /// The text is not YAML (or JSON) at all.
    #[error("scenario {path} is not valid YAML: {problem}")]
    Yaml {
        /// The scenario file.
        path: String,
        /// The parser's message.
        problem: String,
    },
    /// A field is missing, unknown or has a bad value; `field` is its path, e.g.
    /// `fleet[1].count`.
    #[error("scenario {path}: {field}: {problem}")]
    Field {
        /// The scenario file.
        path: String,
        /// The field's path.
        field: String,
        /// What is wrong and what to write instead.
        problem: String,
    },
    /// A flag has a bad value.
    #[error("{flag}: {problem}")]
    Flag {
        /// The flag, e.g. `--gpu-policy`.
        flag: &'static str,
        /// What is wrong with its value.
        problem: String,
    },
    /// A capture's sysfs tree could not be built or discovered (not the user's fault).
    #[error("capture {capture}: {problem}")]
    Fixture {
        /// The capture's name.
        capture: String,
        /// What failed.
        problem: String,
    },
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
