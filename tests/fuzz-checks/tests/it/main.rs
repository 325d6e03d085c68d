//! The fuzz checks' integration test, one binary: every checked-in corpus of `tests/fuzz`
//! replayed through its check (`corpus_replay`).

mod corpus_replay;
