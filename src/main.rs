//! The `seckill` binary: `seckill serve` (the default) runs the service.

fn main() -> std::process::ExitCode {
    seckill::cli::main()
}
