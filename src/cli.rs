//! The command line of the `seckill` binary, and of a binary built on the
//! service that adds options and routes of its own (`seckill-lab`):
//! `seckill serve` (the default) runs the service.

use std::error::Error;
use std::future::Future;
use std::process::ExitCode;

use crate::config::Settings;
use crate::seckill::VoucherDraft;
use crate::startup::{Application, Mount};
use crate::telemetry::Chain;
use chrono::{Duration, Utc};
use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    version,
    about = "A flash-sale (seckill) HTTP backend that never oversells"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli<E: Args> {
    #[command(subcommand)]
    command: Option<Command<E>>,
    #[command(flatten)]
    serve: Serve<E>,
}

#[derive(Subcommand)]
enum Command<E: Args> {
    /// Run the HTTP server (the default).
    Serve(Serve<E>),
}

#[derive(Args)]
struct Serve<E: Args> {
    /// With `--demo` (see [`Settings::demo`]), also creates a demo voucher
    /// (stock 100, on sale for an hour) and prints a user token, the
    /// command that buys it and the storefront's address.
    #[command(flatten)]
    settings: Settings,
    #[command(flatten)]
    extension: E,
}

/// What a binary built on the service adds: options of its own beside the
/// service's, and routes it mounts once the service is built.
pub trait Extension: Args {
    /// Refuses options that cannot work, before anything is touched.
    fn check(&self) -> Result<(), Box<dyn Error>> {
        Ok(())
    }

    /// The mount these options ask for, if any, on the built `app`.
    fn mount(
        self,
        app: &Application,
    ) -> impl Future<Output = Result<Option<Mount>, Box<dyn Error>>>;
}

/// The `seckill` binary's: no options, no routes of its own; but it
/// refuses `SECKILL_LAB`, which asks for a lab it does not have.
#[derive(Args)]
pub struct Plain {
    #[arg(
        long,
        env = "SECKILL_LAB",
        hide = true,
        value_parser = clap::builder::BoolishValueParser::new(),
        num_args = 0..=1,
        default_value_t = false,
        default_missing_value = "true"
    )]
    lab: bool,
}

impl Extension for Plain {
    fn check(&self) -> Result<(), Box<dyn Error>> {
        if self.lab {
            return Err(
                "SECKILL_LAB=1, but this binary has no lab: run seckill-lab \
                 (cargo run -p seckill-lab)"
                    .into(),
            );
        }
        Ok(())
    }

    async fn mount(self, _: &Application) -> Result<Option<Mount>, Box<dyn Error>> {
        Ok(None)
    }
}

/// The `seckill` binary's `main`: parses the command line and runs the
/// service until a signal stops it.
pub fn main() -> ExitCode {
    main_with::<Plain>()
}

/// The `main` of a binary that adds `E` to the service.
#[tokio::main]
pub async fn main_with<E: Extension>() -> ExitCode {
    // A missing .env is normal; a broken one is worth saying.
    if let Err(error) = dotenvy::dotenv() {
        if !error.not_found() {
            eprintln!("ignoring .env: {error}");
        }
    }
    let cli = Cli::<E>::try_parse().unwrap_or_else(|error| exit_naming_variable::<E>(error));
    let serve = match cli.command {
        Some(Command::Serve(serve)) => serve,
        None => cli.serve,
    };
    crate::telemetry::init();
    match run(serve).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = %Chain(&*error), "seckill stopped on an error");
            ExitCode::FAILURE
        }
    }
}

/// Exits on a command line or an environment clap refused, naming the
/// environment variable of the setting at fault beside its flag (clap
/// names only the flag, and most settings come from the environment).
fn exit_naming_variable<E: Extension>(error: clap::Error) -> ! {
    use clap::error::{ContextKind, ContextValue};
    let variable = match error.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(arg)) => {
            let long = arg.split([' ', '=']).next().unwrap_or("");
            variable_of(&<Cli<E> as clap::CommandFactory>::command(), long)
        }
        _ => None,
    };
    match variable {
        Some(variable) => {
            eprint!("{}", error.render());
            eprintln!("(the setting {variable}, or its flag)");
            std::process::exit(2)
        }
        None => error.exit(),
    }
}

/// The environment variable of the option whose flag is `long` (with its
/// dashes), in `command` or its subcommands.
fn variable_of(command: &clap::Command, long: &str) -> Option<String> {
    let name = long.strip_prefix("--")?;
    command
        .get_arguments()
        .find(|arg| arg.get_long() == Some(name))
        .and_then(|arg| arg.get_env())
        .map(|env| env.to_string_lossy().into_owned())
        .or_else(|| {
            command
                .get_subcommands()
                .find_map(|sub| variable_of(sub, long))
        })
}

async fn run<E: Extension>(mut serve: Serve<E>) -> Result<(), Box<dyn Error>> {
    serve.extension.check()?;
    let is_demo = serve.settings.demo;
    if is_demo {
        demo_secrets(&mut serve.settings);
    }
    let mut app = Application::build(serve.settings).await?;
    if let Some(mount) = serve.extension.mount(&app).await? {
        app.mount(mount);
    }
    if is_demo {
        demo(&app).await?;
    }
    app.run_until(shutdown_signal()).await?;
    Ok(())
}

/// The demo's secrets where none are set: random, and the admin token
/// printed, so that the demo runs without a `.env` and nothing in it is a
/// placeholder.
fn demo_secrets(settings: &mut Settings) {
    let random = || {
        let bytes: [u8; 32] = rand::random();
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    if settings.admin_token().is_none() {
        let token = random();
        println!("Admin token for this demo: {token}");
        settings.admin_token = Some(token.into());
    }
    if settings.token_secret().is_none() {
        settings.token_secret = Some(random().into());
    }
    if settings.payment_secret().is_none() {
        settings.payment_secret = Some(random().into());
    }
}

async fn demo(app: &Application) -> Result<(), Box<dyn Error>> {
    let now = Utc::now();
    let voucher_id = app
        .seckill()
        .create_voucher(VoucherDraft {
            title: "Demo voucher".into(),
            stock: 100,
            begin_time: now - Duration::minutes(1),
            end_time: now + Duration::hours(1),
            sale_mode: Default::default(),
            price_cents: 0,
            pay_within_seconds: crate::seckill::DEFAULT_PAY_WITHIN_SECONDS,
            max_orders_per_user: crate::seckill::DEFAULT_MAX_ORDERS_PER_USER,
            // "Limit 2 per customer": the storefront shows its quantity.
            max_units_per_user: 2,
            waiting_room: None,
        })
        .await?;
    let user_id = 1;
    let token = app
        .tokens()
        .sign(user_id, (now + Duration::hours(1)).timestamp());
    let mut addr = app.local_addr();
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let base = format!("http://{addr}");
    println!(
        "\nDemo voucher {voucher_id}: stock 100, on sale for the next hour.\n\
         Buy it as user {user_id}:\n\n  curl -s -X POST -H 'Authorization: Bearer {token}' {base}/seckill/{voucher_id}\n\n\
         See the stock:\n\n  curl -s {base}/vouchers/{voucher_id}\n\n\
         Or open the storefront in a browser (sign in, buy, pay):\n\n  {base}/shop/\n\n\
         and watch the sale from the monitor (it asks for the admin token):\n\n  {base}/shop/monitor\n"
    );
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %Chain(&error), "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(error = %Chain(&error), "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down: draining requests and releasing locks");
}
