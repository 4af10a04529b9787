//! Many counters in one request: `add_batch` and `get_batch` answer per
//! item, in order, so one bad key does not fail the others.
//!
//! ```sh
//! cargo run -p tally-node -- dev                       # in another terminal
//! cargo run -p tally-client --example batch -- http://127.0.0.1:7100
//! ```

use tally_client::{Client, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:7100".to_owned());
    let client = Client::connect(endpoint).await?;

    // A page view: one view for the post, one for its author's profile,
    // and (by mistake) one for an empty key, which is refused on its own.
    let adds = [("post:42:views", 1), ("user:7:profile_views", 1), ("", 1)];
    let results = client.add_batch(adds).await?;
    for ((key, delta), result) in adds.iter().zip(&results) {
        match result {
            Ok(outcome) => println!("add {key:?} {delta:+}: now {}", outcome.value),
            Err(error) => println!("add {key:?} {delta:+}: refused: {error}"),
        }
    }

    // Read them back in one request; a counter never written reads 0.
    let keys = ["post:42:views", "user:7:profile_views", "post:43:views"];
    for (key, value) in keys.iter().zip(client.get_batch(keys).await?) {
        println!("{key}: {}", value?);
    }
    Ok(())
}
