//! The `seckill-lab` binary: the service's command line with the lab's
//! options added; `SECKILL_LAB=1` mounts the lab's routes (LAB.md). The
//! production `seckill` binary has none of it.

/// The allocator of the `seckill` binary, so that the lab's runs measure
/// the service as it is shipped.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    seckill::cli::main_with::<seckill_lab::LabArgs>()
}
