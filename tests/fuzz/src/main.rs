//! One libFuzzer binary for every target: `HAMI_FUZZ_TARGET` names the check
//! (`hami_fuzz_checks::TARGETS`, plus the web UI's `whatif_scenario`), and the corpus folder
//! of the same name under `tests/fuzz/corpus/` seeds it.
//!
//! One binary, not one per target: each target linked the same instrumented, optimized
//! graph (the API server, the DRA driver, the monitor, the web UI), and 33 links of it were
//! a third of CI's fuzz build (BENCHMARKS.md, "Test suite and CI"). Coverage is per binary,
//! so the code of the other targets only adds counters the input never reaches.
//!
//! Reproduce a crash: `HAMI_FUZZ_TARGET=<target> target/<host>/fuzz/hami-fuzz <artifact>`.
#![no_main]

use std::sync::OnceLock;

/// Every target this binary can run: the fuzz-checks' and the web UI's form body.
fn targets() -> impl Iterator<Item = hami_fuzz_checks::Target> {
    hami_fuzz_checks::TARGETS.iter().copied().chain([(
        "whatif_scenario",
        hami_webui::whatif::check_form_body as fn(&[u8]),
    )])
}

/// The check `HAMI_FUZZ_TARGET` names, looked up once (first from the `init` below, before
/// libFuzzer runs any input). An unset or unknown name ends the process with exit code 2 and
/// the list of names: no input runs against a wrong check.
fn check() -> fn(&[u8]) {
    static CHECK: OnceLock<fn(&[u8])> = OnceLock::new();
    *CHECK.get_or_init(|| {
        let wanted = std::env::var("HAMI_FUZZ_TARGET").unwrap_or_default();
        match targets().find(|(name, _)| *name == wanted) {
            Some((_, check)) => check,
            None => {
                let names: Vec<&str> = targets().map(|(name, _)| name).collect();
                eprintln!(
                    "hami-fuzz: HAMI_FUZZ_TARGET={wanted:?} is not a target; set it to one of: {}",
                    names.join(", ")
                );
                std::process::exit(2)
            }
        }
    })
}

libfuzzer_sys::fuzz_target!(
    init: {
        check();
    },
    |data: &[u8]| check()(data)
);
