//! The floods: one attacker's requests over and over beside the crowd.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ATTACKER;
use crate::drive::{self, Request, Tally};

/// `requests` over and over, in turn, over `connections` connections of
/// its own (spread over the instances) until `stop`; `ready` is sent once
/// they are open. No progress bar: the honest crowd's runs beside it.
pub(super) async fn flood_until(
    bases: Vec<String>,
    requests: Vec<Request>,
    connections: usize,
    stop: Arc<AtomicBool>,
    ready: tokio::sync::oneshot::Sender<()>,
) -> Tally {
    let connections = connections.max(1);
    let client = drive::client(connections);
    let address = requests
        .first()
        .and_then(|r| r.from.clone())
        .unwrap_or_else(|| ATTACKER.into());
    let opening: Vec<_> = (0..connections)
        .map(|c| {
            let request = client
                .get(format!("{}/healthz", bases[c % bases.len()]))
                .header("x-forwarded-for", &*address)
                .timeout(Duration::from_secs(5));
            tokio::spawn(async move {
                if let Ok(response) = request.send().await {
                    let _ = response.bytes().await;
                }
            })
        })
        .collect();
    for opened in opening {
        let _ = opened.await;
    }
    let _ = ready.send(());
    let started = Instant::now();
    let requests = Arc::new(requests);
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..connections)
        .map(|c| {
            let (client, requests, next, stop) =
                (client.clone(), requests.clone(), next.clone(), stop.clone());
            let base = bases[c % bases.len()].clone();
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let request = &requests[i % requests.len()];
                    answers.push(drive::exchange(&client, &base, request).await);
                }
                answers
            })
        })
        .collect();
    let mut tally = Tally::starting_at(started);
    for worker in workers {
        for answered in worker.await.unwrap_or_default() {
            tally.record(answered);
        }
    }
    tally.elapsed = started.elapsed();
    tally
}

/// `loadtest flood`: the botnet's reads from a process of its own, so that
/// the machine's cores can be split between the origin (with the honest
/// crowd's driver) and what stands for other machines (the front, the
/// bots). Prints `ready` once its connections are open, floods until its
/// standard input closes, then prints its answers as one JSON line.
#[derive(clap::Args, Clone)]
pub struct FloodArgs {
    /// Where to send the reads (the front's base URL).
    #[arg(long)]
    pub base: String,
    /// The path read over and over.
    #[arg(long)]
    pub path: String,
    /// Addresses the reads claim in turn (`X-Forwarded-For`).
    #[arg(long, default_value_t = 5_000)]
    pub addresses: usize,
    #[arg(long, default_value_t = 200)]
    pub connections: usize,
}

/// What a flood process prints when its input closes.
#[derive(serde::Serialize, serde::Deserialize)]
struct Answers {
    requests: u64,
    statuses: std::collections::BTreeMap<String, u64>,
    seconds: f64,
}

/// The flood process's side: see [`FloodArgs`].
pub async fn flood_process(args: &FloodArgs) -> anyhow::Result<bool> {
    use tokio::io::AsyncReadExt;
    let read = Request::get(&args.path);
    let requests = (0..args.addresses.max(1))
        .map(|i| read.clone().with_address(super::botnet_address(i).into()))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let (ready, opened) = tokio::sync::oneshot::channel();
    let flooding = tokio::spawn(flood_until(
        vec![args.base.clone()],
        requests,
        args.connections,
        stop.clone(),
        ready,
    ));
    let _ = opened.await;
    println!("ready");
    let mut input = tokio::io::stdin();
    let mut sink = [0u8; 64];
    while input.read(&mut sink).await? > 0 {}
    stop.store(true, Ordering::Relaxed);
    let tally = flooding.await?;
    let answers = Answers {
        requests: tally.requests,
        statuses: tally.statuses,
        seconds: tally.elapsed.as_secs_f64(),
    };
    println!("{}", serde_json::to_string(&answers)?);
    Ok(true)
}

/// A flood process this driver started.
pub(super) struct FloodProcess {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl FloodProcess {
    /// Starts `loadtest flood` (this binary), on `cpus` at the lowest
    /// priority when given, and waits until its connections are open.
    pub(super) async fn start(
        base: &str,
        path: &str,
        addresses: usize,
        connections: usize,
        cpus: Option<&str>,
    ) -> anyhow::Result<Self> {
        use anyhow::Context;
        use tokio::io::AsyncBufReadExt;
        let me = std::env::current_exe().context("this driver's path")?;
        // Placed, the bots stand for machines of their own: on the front's
        // cores at the lowest priority, so that their own CPU never delays
        // the front's answers (the flood gets what the front leaves).
        let mut command = match cpus {
            Some(cpus) => {
                let mut c = tokio::process::Command::new("nice");
                c.args(["-n", "19", "taskset", "-c", cpus]).arg(me);
                c
            }
            None => tokio::process::Command::new(me),
        };
        command
            .args(["flood", "--base", base, "--path", path])
            .args(["--addresses", &addresses.to_string()])
            .args(["--connections", &connections.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().context("starting the flood process")?;
        let stdout = child.stdout.take().context("the flood's output")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        match tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await {
            Ok(Ok(Some(line))) if line == "ready" => Ok(Self { child, lines }),
            other => anyhow::bail!("the flood process did not start: {other:?}"),
        }
    }

    /// Its process id (for its CPU time).
    pub(super) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Stops the flood; its answers as a tally.
    pub(super) async fn stop(mut self) -> anyhow::Result<Tally> {
        use anyhow::Context;
        drop(self.child.stdin.take());
        let line = tokio::time::timeout(Duration::from_secs(30), self.lines.next_line())
            .await
            .context("the flood process did not report within 30 s")??
            .context("the flood process ended without its answers")?;
        let answers: Answers = serde_json::from_str(&line)?;
        let _ = self.child.wait().await;
        let mut tally = Tally::new();
        tally.requests = answers.requests;
        tally.statuses = answers.statuses;
        tally.elapsed = Duration::from_secs_f64(answers.seconds);
        Ok(tally)
    }
}
