//! The `seckill-lab` binary: the service with the lab compiled in
//! (`cargo build --features lab --bin seckill-lab`); `SECKILL_LAB=1` mounts
//! its routes (LAB.md). The production `seckill` binary has none of it.

fn main() -> std::process::ExitCode {
    seckill::cli::main()
}
