//! The fuzz checks' integration test, one binary: every checked-in corpus of `tests/fuzz`
//! replayed through its check (`corpus_replay`), and the count reader against the stand-in API
//! server's stored quantity forms (`quantity_agreement`).

mod corpus_replay;
mod quantity_agreement;
