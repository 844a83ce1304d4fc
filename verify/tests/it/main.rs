//! The integration tests of memra-verify, one module per area, linked into one test binary.

mod golden;
mod graph_lazy_masks;
mod inspect;
mod invariance_cpu;
mod mtp_check;
mod pp_gate;
mod serve_invariance;
mod spec_gate;
mod vision;
