//! memra-verify: exactness gates.
