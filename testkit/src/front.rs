//! The shipped front (`deploy/nginx.conf`: nginx with a one-second
//! micro-cache for the public reads) run as a process of its own on a free
//! loopback port, in front of instances given by address.

use anyhow::Context;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An nginx running the shipped configuration; stopped when dropped.
pub struct Front {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Front {
    /// Starts nginx with `deploy/nginx.conf`, its marked lines set for this
    /// machine: one worker, its files under a folder of its own, the
    /// instances at `upstreams`, listening on a free loopback port.
    pub fn start(upstreams: &[SocketAddr]) -> anyhow::Result<Self> {
        Self::start_on(upstreams, None)
    }

    /// [`Front::start`], its processes on the cores `cpus` when given
    /// (`taskset`'s list syntax: `1`, `2-3`): a load test on one machine
    /// keeps the front off the cores of the instances behind it.
    pub fn start_on(upstreams: &[SocketAddr], cpus: Option<&str>) -> anyhow::Result<Self> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let shipped = std::fs::read_to_string(root.join("deploy/nginx.conf"))
            .context("reading deploy/nginx.conf")?;
        let port = crate::free_port().context("no free port")?;
        let servers: String = upstreams.iter().map(|a| format!("server {a};\n")).collect();
        let mut config = String::new();
        for line in shipped.lines() {
            let set = line.trim_start();
            let line = if set.starts_with("server 127.0.0.1:8080;") {
                servers.clone()
            } else if set.starts_with("listen ") {
                format!("listen 127.0.0.1:{port};")
            } else {
                line.to_owned()
            };
            config.push_str(&line);
            config.push('\n');
        }
        if !config.contains(&format!("listen 127.0.0.1:{port};")) || !config.contains(&servers) {
            anyhow::bail!(
                "deploy/nginx.conf has no `listen` or `server 127.0.0.1:8080;` line to set"
            );
        }
        let dir = std::env::temp_dir().join(format!("seckill-front-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
        // nginx's workers run as nobody: they must reach the cache folder.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777));
        }
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, config).with_context(|| conf.display().to_string())?;
        let nginx = ["/usr/sbin/nginx", "nginx"]
            .into_iter()
            .find(|p| Path::new(p).exists() || which(p))
            .context("nginx is not installed (scripts/deps.sh installs it)")?;
        let mut command = match cpus {
            Some(cpus) => {
                let mut taskset = Command::new("taskset");
                taskset.args(["-c", cpus, nginx]);
                taskset
            }
            None => Command::new(nginx),
        };
        let child = command
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(&conf)
            .args(["-g", "daemon off;"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting nginx")?;
        let mut front = Self { child, dir, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = front.child.try_wait() {
                anyhow::bail!("nginx exited: {status}");
            }
            if Instant::now() > deadline {
                anyhow::bail!("nginx did not listen within 10 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(front)
    }

    /// The process id of nginx's master (its workers are its children).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The front's base URL.
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

fn which(name: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Drop for Front {
    fn drop(&mut self) {
        // SIGTERM: nginx's master stops its workers and exits.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
