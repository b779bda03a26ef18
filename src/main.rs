//! The `seckill` binary: `seckill serve` (the default) runs the service.

/// mimalloc, not glibc's allocator: a third of the allocator's CPU under
/// a flash crowd (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    seckill::cli::main()
}
