//! The web UI's integration tests, one binary, each against its own stand-ins (the embedded
//! API server, small monitor servers, the real `hami-webui` binary, Debian's Prometheus):
//! bad and hostile HTTP input, `--dra auto`, Prometheus `/federate`, a refused watch logged
//! once, SIGTERM while planning, the What-if fuzz corpus, whole cards on the node page, the
//! cards and pods pages' routes.
//! The whole-system browser test (Chromium against the demo) is in `tests/system`.

mod bad_input;
mod cards;
mod dra_auto;
mod pods;
mod prometheus;
mod refused_watch_logs;
mod stop_while_planning;
mod support;
mod whatif_corpus;
mod whatif_live;
mod whole_cards;
