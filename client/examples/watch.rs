//! Follow a counter live and render it the way a page shows it ("40.2K"):
//! the stream yields the current value first, then each change.
//!
//! ```sh
//! cargo run -p tally-node -- dev                       # in another terminal
//! cargo run -p tally-client --example watch -- http://127.0.0.1:7100
//! ```
//!
//! The example adds 40,213 likes to a fresh post while it watches, so the
//! last line it prints is `40.2K likes`; it stops there.

use futures::StreamExt;
use tally_client::{format_count, Client, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:7100".to_owned());
    let client = Client::connect(endpoint).await?;
    let key = format!("example:post:{}:likes", std::process::id());

    let mut likes = client.watch(&key).await?;
    let start = client.get(&key).await?;
    let target = start + 40_213;

    // Someone else likes the post meanwhile: here, a task on this client.
    let liker = client.clone();
    let liking = {
        let key = key.clone();
        tokio::spawn(async move {
            for chunk in [213, 10_000, 30_000] {
                liker.add(&key, chunk).await?;
            }
            Ok::<_, Error>(())
        })
    };

    while let Some(value) = likes.next().await {
        let value = value?;
        println!("{} likes", format_count(value));
        if value >= target {
            break;
        }
    }
    liking.await.expect("the liking task panicked")?;
    Ok(())
}
