//! The protocol's count reader against the stand-in API server's canonical quantities
//! (written after apimachinery's rules): a count written plainly reads back as itself from
//! the form the server stores (`3000` -> `3k` -> 3000), for counts of every size and any
//! number of trailing zeros.

use hami_apiserver::quantity::canonical;
use hami_protocol::quantity::parse_count;

fn reads_back(n: u64) {
    let stored = canonical(&n.to_string()).expect("a plain integer is a quantity");
    assert_eq!(parse_count(&stored), Ok(n), "{n} is stored as {stored:?}");
}

#[test]
fn every_count_written_plainly_reads_back_from_its_stored_form() {
    for m in [1u64, 3, 16, 50, 999, 1000, 1024, 12_345, 18, u64::MAX] {
        let mut n = m;
        loop {
            reads_back(n);
            match n.checked_mul(10) {
                Some(next) => n = next,
                None => break,
            }
        }
    }
    // xorshift64: a fixed sweep, so a failure reproduces; each value also with its low
    // digits zeroed, where the suffixes (k, M, … E) come in.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..50_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        reads_back(x);
        let scale = 10u64.pow((x % 20) as u32);
        reads_back(x / scale * scale);
    }
    assert_eq!(canonical("3000").as_deref(), Ok("3k"));
    assert_eq!(parse_count("3k"), Ok(3000));
}
