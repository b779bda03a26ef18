//! The `seckill` binary: `seckill serve` (the default) runs the service.

/// mimalloc, not glibc's allocator: in a profile of the service under
/// `loadtest speed`, glibc's `malloc`/`free` (with their consolidation of
/// freed chunks) took 21% of its CPU samples, mimalloc's 7% (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    seckill::cli::main()
}
