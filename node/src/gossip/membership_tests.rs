//! Unit tests of membership: members resolved by replica id (a name never hides
//! a live replica), parsed key-values and protocol windows, typed start errors.

use std::collections::HashMap;

use super::*;

fn id(name: &str, generation: u64) -> ChitchatId {
    ChitchatId::new(name, generation, ([127, 0, 0, 1], 7000).into())
}

fn values(replica: u64) -> HashMap<&'static str, String> {
    HashMap::from([
        (KEY_REGION, "eu".to_string()),
        (KEY_NODE_NAME, "eu-1".to_string()),
        (KEY_REPLICA, hex(replica)),
        (KEY_GRPC_ADDR, "127.0.0.1:7100".to_string()),
        (KEY_DURABLE_SEQ, "7".to_string()),
        (KEY_DIGEST, hex(0xabc)),
    ])
}

#[track_caller]
fn parse(values: &HashMap<&'static str, String>, alive: bool) -> Result<Member, String> {
    parse_member(&id("eu-1", 1), alive, |key| {
        values.get(key).map(String::as_str)
    })
}

fn member(name: &str, replica: u64) -> Member {
    Member {
        replica: ReplicaId(replica),
        node_name: name.to_string(),
        ..Member::default()
    }
}

fn config(gossip_listen: SocketAddr, gossip_interval: Duration) -> MembershipConfig {
    MembershipConfig {
        cluster_id: "c".into(),
        node_name: "eu-1".into(),
        region: "eu".into(),
        replica: ReplicaId(1),
        gossip_listen,
        gossip_advertise: gossip_listen,
        partitions: 256,
        born_at: 0,
        holding: None,
        state: None,
        grpc_advertise: "127.0.0.1:7100".into(),
        seeds: Vec::new(),
        gossip_interval,
        protocol: ProtocolWindow::default(),
    }
}

#[tokio::test]
async fn start_failures_are_typed_and_name_the_setting() {
    let addr: SocketAddr = ([127, 0, 0, 1], 0).into();
    let zero = MembershipHandle::spawn(config(addr, Duration::ZERO)).await;
    assert!(matches!(zero, Err(MembershipError::ZeroGossipInterval)));
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap();
    let error = MembershipHandle::spawn(config(busy, Duration::from_millis(100)))
        .await
        .err()
        .expect("a busy gossip port");
    assert!(
        matches!(&error, MembershipError::Start { addr, .. } if *addr == busy),
        "{error}"
    );
    assert!(error.to_string().contains("--gossip-addr"), "{error}");
}

#[test]
fn parses_published_values() {
    let member = parse(&values(0x12), true).unwrap();
    assert_eq!(member.replica, ReplicaId(0x12));
    assert_eq!(member.region, "eu");
    assert_eq!(member.grpc_addr, "127.0.0.1:7100");
    assert_eq!(member.gossip_addr, "127.0.0.1:7000");
    assert_eq!((member.durable_seq, member.digest), (7, 0xabc));
    assert!(member.alive);
    assert_eq!(
        member.protocol,
        ProtocolWindow::announced(0, 0),
        "announces none: a build before versions"
    );
}

#[test]
fn the_sets_digest_is_optional_for_older_builds() {
    let mut published = values(0x12);
    assert_eq!(
        parse(&published, true).unwrap().sets_digest,
        None,
        "an older build"
    );
    published.insert(KEY_SETS_DIGEST, hex(0x5e7));
    assert_eq!(parse(&published, true).unwrap().sets_digest, Some(0x5e7));
    published.insert(KEY_SETS_DIGEST, "nope".to_string());
    let error = parse(&published, true).unwrap_err();
    assert!(error.contains("sets_digest"), "{error}");
}

#[test]
fn parses_the_announced_protocol_versions() {
    let mut announcing = values(1);
    announcing.insert(KEY_PROTOCOL, "2".to_string());
    announcing.insert(KEY_PROTOCOL_OLDEST, "2".to_string());
    assert_eq!(
        parse(&announcing, true).unwrap().protocol,
        ProtocolWindow::at(2, 2)
    );
    announcing.insert(KEY_PROTOCOL, "two".to_string());
    assert!(parse(&announcing, true).is_err());
}

#[test]
fn parses_the_announced_partition_count() {
    assert_eq!(
        parse(&values(1), true).unwrap().partitions,
        0,
        "none announced"
    );
    let mut announcing = values(1);
    announcing.insert(KEY_PARTITIONS, "64".to_string());
    assert_eq!(parse(&announcing, true).unwrap().partitions, 64);
    announcing.insert(KEY_PARTITIONS, "many".to_string());
    assert!(parse(&announcing, true).is_err());
}

#[test]
fn parses_the_version_a_directory_was_born_at() {
    assert_eq!(
        parse(&values(1), true).unwrap().born_at,
        0,
        "none announced: an older build"
    );
    let mut announcing = values(1);
    announcing.insert(KEY_BORN_AT, "7".to_string());
    assert_eq!(parse(&announcing, true).unwrap().born_at, 7);
    announcing.insert(KEY_BORN_AT, "seven".to_string());
    let error = parse(&announcing, true).unwrap_err();
    assert!(error.contains("born_at"), "{error}");
}

#[test]
fn a_leaving_node_is_not_alive() {
    let mut leaving = values(1);
    leaving.insert(KEY_LEAVING, "true".to_string());
    assert!(!parse(&leaving, true).unwrap().alive);
}

#[test]
fn missing_or_malformed_values_are_refused() {
    let mut missing = values(1);
    missing.remove(KEY_GRPC_ADDR);
    assert!(parse(&missing, true).is_err());
    let mut short = values(1);
    short.insert(KEY_REPLICA, "12".to_string());
    assert!(parse(&short, true).is_err());
    let mut not_a_number = values(1);
    not_a_number.insert(KEY_DURABLE_SEQ, "-1".to_string());
    assert!(parse(&not_a_number, true).is_err());
}

fn alive(name: &str, replica: u64) -> Member {
    Member {
        alive: true,
        ..member(name, replica)
    }
}

#[test]
fn live_holders_of_one_name_are_all_members() {
    let replicas = |candidates| {
        resolve_members(&id("me", 5), ReplicaId(100), candidates)
            .iter()
            .map(|(_, m)| m.replica.0)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        replicas(vec![
            (id("x", 1), alive("x", 1)),   // the first x
            (id("x", 2), alive("x", 2)),   // a second process named x
            (id("me", 7), alive("me", 7)), // a live process with our name
        ]),
        [1, 2, 7],
        "a name never hides a live replica"
    );
    assert_eq!(
        replicas(vec![
            (id("x", 1), alive("x", 1)), // the first x, still alive
            (id("x", 2), member("x", 2)), // the second x left
            (id("me", 3), member("me", 3)), // our own earlier, wiped incarnation
        ]),
        [1, 2],
        "a newer incarnation that is gone stays listed (down); an older one that is gone is dropped"
    );
}

#[test]
fn the_newest_incarnation_supersedes_older_ones() {
    let resolved = resolve_members(
        &id("me", 5),
        ReplicaId(100),
        vec![
            (id("me", 1), member("me", 99)),        // an old incarnation of us
            (id("other", 9), member("other", 100)), // claims our replica id
            (id("b", 1), member("b", 1)),           // b before a disk wipe
            (id("b", 2), member("b", 2)),           // b after it
            (id("c", 3), member("c", 3)),           // c restarted, same disk,
            (id("c-renamed", 4), member("c-renamed", 3)), // under a new name
        ],
    );
    let names: Vec<&str> = resolved.iter().map(|(_, m)| m.node_name.as_str()).collect();
    assert_eq!(names, ["b", "c-renamed"]);
    assert_eq!(resolved[0].1.replica, ReplicaId(2));
    assert_eq!(
        resolved[1].0,
        id("c-renamed", 4),
        "the incarnation it came from"
    );
}

#[test]
fn lifecycle_keys_parse_and_a_build_without_them_is_active() {
    let values = values(1);
    let member = parse(&values, true).unwrap();
    let facts = parse_lifecycle(&member, |key| values.get(key).map(String::as_str));
    assert_eq!(facts.state, NodeState::Active);
    assert!(facts.removed.is_empty() && facts.drain_requests.is_empty());
    let mut values = values;
    values.insert(KEY_STATE, "draining".into());
    values.insert(KEY_REMOVED, format!("{},{}", hex(7), hex(8)));
    values.insert(KEY_DRAIN, hex(9));
    let facts = parse_lifecycle(&member, |key| values.get(key).map(String::as_str));
    assert_eq!(facts.state, NodeState::Draining);
    assert_eq!(facts.removed, BTreeSet::from([ReplicaId(7), ReplicaId(8)]));
    assert_eq!(facts.drain_requests, BTreeSet::from([ReplicaId(9)]));
    assert_eq!(hex_list(&facts.removed), values[KEY_REMOVED]);
    values.insert(KEY_STATE, "sleeping".into());
    let facts = parse_lifecycle(&member, |key| values.get(key).map(String::as_str));
    assert_eq!(facts.state, NodeState::Active, "unknown: read as active");
}
