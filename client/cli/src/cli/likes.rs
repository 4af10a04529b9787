//! The like-set and uniques commands: `like`, `unlike`, `liked`, `likes
//! [--list]`, `observe`, `distinct` and `admin verify`. Each connects, calls
//! the library, and prints a line (or, with `--json`, one object: `liked`
//! prints `{"key", "member", "liked"}`, `likes` `{"key", "count"}`,
//! `distinct` `{"keys", "estimate"}`).

use serde::Serialize;

use super::output::{print_json, print_line};
use super::Target;

/// `tally like KEY MEMBER` and `tally unlike KEY MEMBER`.
pub async fn like(
    target: &Target,
    key: &str,
    member: &str,
    like: bool,
    json: bool,
) -> anyhow::Result<()> {
    let client = target.connect().await?;
    let outcome = match like {
        true => client.like(key, member).await?,
        false => client.unlike(key, member).await?,
    };
    if json {
        #[derive(Serialize)]
        struct Liked<'a> {
            key: &'a str,
            member: &'a str,
            liked: bool,
            changed: bool,
            count: u64,
        }
        return print_json(&Liked {
            key,
            member,
            liked: outcome.liked,
            changed: outcome.changed,
            count: outcome.count,
        });
    }
    let what = match (outcome.changed, outcome.liked) {
        (true, true) => "liked",
        (true, false) => "unliked",
        (false, true) => "already liked (nothing changed)",
        (false, false) => "not liked (nothing changed)",
    };
    print_line(format_args!("{what}; {} likes", outcome.count))?;
    Ok(())
}

/// `tally liked KEY MEMBER`.
pub async fn liked(target: &Target, key: &str, member: &str, json: bool) -> anyhow::Result<()> {
    let client = target.connect().await?;
    let liked = client.liked(key, &[member]).await?[0];
    if json {
        return print_json(&serde_json::json!({ "key": key, "member": member, "liked": liked }));
    }
    print_line(if liked { "liked" } else { "not liked" })?;
    Ok(())
}

/// `tally likes KEY [--list]`.
pub async fn likes(target: &Target, key: &str, list: bool, json: bool) -> anyhow::Result<()> {
    let client = target.connect().await?;
    if !list {
        let count = client.like_count(key).await?;
        if json {
            return print_json(&serde_json::json!({ "key": key, "count": count }));
        }
        print_line(count)?;
        return Ok(());
    }
    let mut token: Option<Vec<u8>> = None;
    loop {
        let page = client.list_likes(key, token.as_deref(), 0).await?;
        for member in &page.members {
            if json {
                print_json(&serde_json::json!({ "key": key, "member": member }))?;
            } else {
                print_line(member)?;
            }
        }
        match page.next_token {
            Some(next) => token = Some(next),
            None => return Ok(()),
        }
    }
}

/// `tally observe KEY MEMBER...`.
pub async fn observe(
    target: &Target,
    key: &str,
    members: &[String],
    json: bool,
) -> anyhow::Result<()> {
    let client = target.connect().await?;
    let estimate = client.observe(key, members).await?;
    if json {
        return print_json(&serde_json::json!({ "keys": [key], "estimate": estimate }));
    }
    print_line(estimate)?;
    Ok(())
}

/// `tally distinct KEY...`.
pub async fn distinct(target: &Target, keys: &[String], json: bool) -> anyhow::Result<()> {
    let client = target.connect().await?;
    let estimate = client.distinct(keys).await?;
    if json {
        return print_json(&serde_json::json!({ "keys": keys, "estimate": estimate }));
    }
    print_line(estimate)?;
    Ok(())
}

/// `tally admin verify KEY`: recounts a like set; exits non-zero on a difference.
pub async fn verify(target: &Target, key: &str, json: bool) -> anyhow::Result<()> {
    let client = target.connect().await?;
    let recount = client.verify_likes(key).await?;
    if json {
        print_json(&serde_json::json!({
            "key": key,
            "stored": recount.stored,
            "recounted": recount.recounted,
            "scanned": recount.scanned,
            "consistent": recount.consistent,
        }))?;
    } else {
        print_line(format_args!(
            "{key}: count {}, recounted {} from {} members: {}",
            recount.stored,
            recount.recounted,
            recount.scanned,
            if recount.consistent {
                "consistent"
            } else {
                "DIFFERENT (a bug: see the node's error log)"
            }
        ))?;
    }
    anyhow::ensure!(
        recount.consistent,
        "the like set {key:?} count differs from its members"
    );
    Ok(())
}
