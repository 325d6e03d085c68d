//! hami-cel-peer's integration tests, one binary: the launcher against small scripts of
//! each outcome (`launcher`; the scripts are in `tests/fixtures`).

mod launcher;
