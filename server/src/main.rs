//! memra-server: the OpenAI-compatible API (filled by the server work).
fn main() {
    eprintln!("memra-server: not yet implemented; use `run-gen` for now");
    std::process::exit(2);
}
