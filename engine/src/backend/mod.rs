//! The narrow Backend trait. Pending.
