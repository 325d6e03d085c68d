//! The SM limiter: a token bucket per device whose refill follows the sampled utilization.
//!
//! Each launch costs its number of thread blocks (graphs and cooperative launches cost the
//! running average of a kernel launch). Each tick (one NVML sampling window), the refill is
//! set from what this process consumed and the utilization the container showed in that
//! window: `refill = consumed × limit / utilization`, i.e. the consumption that would have
//! produced exactly the limit. Every process of a container runs this against the container
//! sum, so their refills add up to the container's share. The gain is linear in the pool
//! (the reference's sm² step barely throttles large GPUs, HAMi-core #274/#314).

/// The controller's decision for the next tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refill {
    /// No throttling (below the limit with nothing consumed, or no limit).
    Unlimited,
    /// Tokens added per tick.
    Tokens(u64),
}

/// Next refill from this tick's `consumed` tokens and the container's `util` percent.
pub fn next_refill(limit: u64, util: u64, consumed: u64, current: Refill) -> Refill {
    if limit == 0 || limit >= 100 {
        return Refill::Unlimited;
    }
    if util == 0 {
        // Idle or unsampled: open up gradually.
        return match current {
            Refill::Unlimited => Refill::Unlimited,
            Refill::Tokens(t) => Refill::Tokens(t.saturating_mul(2).max(1)),
        };
    }
    if consumed == 0 {
        return current;
    }
    let target = (consumed as u128 * limit as u128 / util as u128).max(1) as u64;
    match current {
        Refill::Unlimited if util <= limit => Refill::Unlimited,
        Refill::Unlimited => Refill::Tokens(target),
        // Smooth: halfway to the target, so one late sample does not swing the rate.
        Refill::Tokens(t) => Refill::Tokens(((t as u128 + target as u128) / 2).max(1) as u64),
    }
}

/// Tokens after a refill: the balance may be negative (a large launch borrows), and at most
/// two ticks' worth are kept so an idle spell does not turn into an unthrottled burst.
pub fn refill_balance(balance: i64, refill: u64) -> i64 {
    let cap = refill.saturating_mul(2).min(i64::MAX as u64) as i64;
    balance
        .saturating_add(refill.min(i64::MAX as u64) as i64)
        .min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn throttles_to_the_limit() {
        // 1000 tokens gave 90 %: the limit of 30 % is 333 tokens.
        assert_eq!(
            next_refill(30, 90, 1000, Refill::Unlimited),
            Refill::Tokens(333)
        );
        assert_eq!(
            next_refill(30, 20, 1000, Refill::Unlimited),
            Refill::Unlimited
        );
        assert_eq!(
            next_refill(30, 30, 300, Refill::Tokens(300)),
            Refill::Tokens(300)
        );
        assert_eq!(
            next_refill(100, 90, 1000, Refill::Tokens(5)),
            Refill::Unlimited
        );
        assert_eq!(next_refill(30, 0, 0, Refill::Tokens(5)), Refill::Tokens(10));
        assert_eq!(refill_balance(-50, 100), 50);
        assert_eq!(refill_balance(150, 100), 200);
    }

    proptest! {
        /// With utilization proportional to consumption, the rate converges to the limit.
        #[test]
        fn converges(limit in 5..95u64, per_pct in 1..1000u64, offered in 1..100u64) {
            let mut refill = Refill::Unlimited;
            let mut util = 100u64;
            for _ in 0..40 {
                let consumed = match refill {
                    Refill::Unlimited => per_pct * 100,
                    Refill::Tokens(t) => t.min(per_pct * 100),
                };
                util = (consumed / per_pct).min(100);
                let _ = offered;
                refill = next_refill(limit, util, consumed, refill);
            }
            prop_assert!(util <= limit + 2, "util {util} limit {limit}");
            prop_assert!(util + 3 >= limit, "util {util} limit {limit}");
        }
    }
}
