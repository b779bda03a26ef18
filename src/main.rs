//! The `seckill` binary: `seckill serve` (the default) runs the service.

/// mimalloc instead of glibc's malloc: a purchase allocates and frees many
/// small buffers across threads, where glibc spent about a fifth of the
/// service's CPU (BENCHMARKS.md, "Speed").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    seckill::cli::main()
}
