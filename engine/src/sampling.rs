//! Sampling. Pending.
