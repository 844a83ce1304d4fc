//! The integration tests of memra-server, one module per area, linked into one test binary.

mod api;
mod auth;
mod checkpoints;
mod choices;
mod common;
mod drain;
mod flags;
mod fuzz_replay;
mod lifecycle;
mod real_model;
mod request_battery;
mod request_proptest;
mod routing;
mod security;
mod served;
mod spec_mtp;
mod tiny_engine;
mod vision;
mod vision_video;
