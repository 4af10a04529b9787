//! The accept loops of the gRPC and HTTP ports, which nothing outside the
//! cluster may make spin or grow: a failed `accept` (file descriptors or
//! memory run out, `EMFILE`) backs off, from [`FIRST_BACKOFF`] doubling to
//! [`MAX_BACKOFF`], and is logged once per [`RepeatedWarning`] period with
//! the count, instead of retrying at once (a core at 90% while the limit
//! lasted). Accepted sockets get `TCP_NODELAY`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

use crate::log_flood::{RepeatedWarning, SUMMARY_PERIOD};
use crate::metrics::Metrics;

/// The first pause after a failed accept.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// The longest pause between two accepts that fail.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Accepts on `listener` until the returned stream is dropped; `port`
/// names the port in logs and in `tally_refused_messages_total{reason}`.
pub fn accept_plain(
    listener: TcpListener,
    port: &'static str,
    metrics: Arc<Metrics>,
) -> (ReceiverStream<std::io::Result<TcpStream>>, JoinHandle<()>) {
    let (streams_tx, streams_rx) = tokio::sync::mpsc::channel(64);
    let task = tokio::spawn(async move {
        let mut backoff = Backoff::new(port, metrics);
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = streams_tx.closed() => return,
            };
            let Some((tcp, _)) = backoff.handle(accepted).await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            if streams_tx.send(Ok(tcp)).await.is_err() {
                return;
            }
        }
    });
    (ReceiverStream::new(streams_rx), task)
}

/// The backoff of one accept loop.
pub struct Backoff {
    port: &'static str,
    metrics: Arc<Metrics>,
    pause: Duration,
    warning: RepeatedWarning,
}

impl Backoff {
    /// The backoff of the loop of `port`.
    pub fn new(port: &'static str, metrics: Arc<Metrics>) -> Backoff {
        Backoff {
            port,
            metrics,
            pause: FIRST_BACKOFF,
            warning: RepeatedWarning::new(SUMMARY_PERIOD),
        }
    }

    /// Passes an accepted connection on (and resets the pause), or logs and
    /// counts a failure and sleeps for the pause, which then doubles.
    pub async fn handle<T>(&mut self, accepted: std::io::Result<T>) -> Option<T> {
        match accepted {
            Ok(accepted) => {
                self.pause = FIRST_BACKOFF;
                Some(accepted)
            }
            Err(error) => {
                self.metrics.refused("accept_failed");
                if self.warning.handle_occurrence(Instant::now()) {
                    tracing::warn!(
                        port = self.port,
                        %error,
                        pause_ms = self.pause.as_millis() as u64,
                        "accepting a connection failed (out of file descriptors? see ulimit -n); \
                         backing off, repeats are summarised once a minute"
                    );
                }
                tokio::time::sleep(self.pause).await;
                self.pause = (self.pause * 2).min(MAX_BACKOFF);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn failed_accepts_back_off_and_a_success_resets_the_pause() {
        let metrics = Arc::new(Metrics::new());
        let mut backoff = Backoff::new("test", metrics.clone());
        let emfile = || Err::<(), _>(std::io::Error::from_raw_os_error(24));
        let started = tokio::time::Instant::now();
        for _ in 0..10 {
            assert!(backoff.handle(emfile()).await.is_none());
        }
        // 10 + 20 + ... + 640 ms, then 1 s twice: never a busy loop.
        assert!(started.elapsed() >= Duration::from_millis(3_270));
        assert_eq!(backoff.pause, MAX_BACKOFF);
        assert_eq!(backoff.handle(Ok(7)).await, Some(7));
        assert_eq!(backoff.pause, FIRST_BACKOFF);
        assert!(metrics
            .encode_text()
            .contains("tally_refused_messages_total{reason=\"accept_failed\"} 10"));
    }
}
