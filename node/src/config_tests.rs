//! Unit tests of the configuration: parsing, defaults, and errors that name the
//! setting and where its bad value came from.

use super::*;

#[test]
fn durations_parse() {
    assert_eq!(
        parse_duration("x", "250ms").unwrap(),
        Duration::from_millis(250)
    );
    assert_eq!(
        parse_duration("x", "24h").unwrap(),
        Duration::from_secs(86_400)
    );
    assert!(parse_duration("--sync-interval", "fast")
        .unwrap_err()
        .to_string()
        .contains("--sync-interval"));
}

#[test]
fn file_settings_apply_under_flags_and_unknown_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tally.toml");
    std::fs::write(
        &path,
        "region = \"eu\"\nnode_name = \"a\"\ndurability = \"async\"\n",
    )
    .unwrap();
    let args = RunArgs {
        config: Some(path.clone()),
        node_name: Some("b".into()),
        ..Default::default()
    };
    let settings = Settings::resolve(args).unwrap();
    assert_eq!(
        (settings.region.as_str(), settings.node_name.as_str()),
        ("eu", "b")
    );
    assert_eq!(settings.durability, Durability::Async);

    std::fs::write(&path, "regoin = \"eu\"\n").unwrap();
    let err = Settings::resolve(RunArgs {
        config: Some(path.clone()),
        ..Default::default()
    })
    .unwrap_err();
    assert!(format!("{err:#}").contains("regoin"), "{err:#}");
    std::fs::write(&path, "durability = \"sometimes\"\n").unwrap();
    let err = Settings::resolve(RunArgs {
        config: Some(path),
        ..Default::default()
    })
    .unwrap_err();
    assert!(format!("{err:#}").contains("durability"), "{err:#}");
}

#[test]
fn bad_values_name_their_setting() {
    let err = Settings::resolve(RunArgs {
        grpc_addr: Some("nowhere".into()),
        ..Default::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("--grpc-addr"));
    let named = RunArgs {
        advertise_gossip_addr: Some("localhost:7101".into()),
        ..Default::default()
    };
    assert_eq!(
        Settings::resolve(named)
            .unwrap()
            .advertise_gossip_addr
            .port(),
        7101
    );
    let err = Settings::resolve(RunArgs {
        region: Some("a b".into()),
        ..Default::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("--region"));
}

#[test]
fn peer_source_ip_is_an_ip_from_any_source() {
    assert_eq!(
        Settings::resolve(RunArgs::default())
            .unwrap()
            .peer_source_ip,
        None
    );
    let settings = Settings::resolve(RunArgs {
        peer_source_ip: Some("127.0.0.3".into()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(settings.peer_source_ip, Some("127.0.0.3".parse().unwrap()));

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tally.toml");
    std::fs::write(&path, "peer_source_ip = \"10.0.1.5\"\n").unwrap();
    let settings = Settings::resolve(RunArgs {
        config: Some(path),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(settings.peer_source_ip, Some("10.0.1.5".parse().unwrap()));

    let err = Settings::resolve(RunArgs {
        peer_source_ip: Some("10.0.1.5:7100".into()),
        ..Default::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("--peer-source-ip"), "{err}");
}

#[test]
fn min_free_disk_and_shutdown_grace_have_defaults_and_name_themselves() {
    let defaults = Settings::resolve(RunArgs::default()).unwrap();
    assert_eq!(defaults.min_free_disk, FreeSpaceFloor::Default);
    assert_eq!(defaults.shutdown_grace, Duration::from_secs(10));
    let settings = Settings::resolve(RunArgs {
        min_free_disk: Some("5%".into()),
        shutdown_grace: Some("3s".into()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(settings.min_free_disk, FreeSpaceFloor::Percent(5.0));
    assert_eq!(settings.shutdown_grace, Duration::from_secs(3));
    let err = Settings::resolve(RunArgs {
        min_free_disk: Some("plenty".into()),
        ..Default::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("--min-free-disk"), "{err}");
}

#[test]
fn store_cache_bytes_has_a_default_and_a_floor() {
    let defaults = Settings::resolve(RunArgs::default()).unwrap();
    assert_eq!(
        defaults.store_cache_bytes,
        crate::store::DEFAULT_CACHE_BYTES
    );
    let settings = Settings::resolve(RunArgs {
        store_cache_bytes: Some(64 << 20),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(settings.store_cache_bytes, 64 << 20);
    let err = Settings::resolve(RunArgs {
        store_cache_bytes: Some(4096),
        ..Default::default()
    })
    .unwrap_err();
    assert!(err.to_string().contains("--store-cache-bytes"), "{err}");
}

#[test]
fn refusals_are_typed_and_carry_their_setting() {
    let refused = |args: RunArgs| Settings::resolve(args).unwrap_err();
    let err = refused(RunArgs {
        store_cache_bytes: Some(4096),
        ..Default::default()
    });
    assert!(
        matches!(&err, ConfigError::CacheTooSmall { setting, bytes: 4096 } if setting == "--store-cache-bytes"),
        "{err:?}"
    );
    let err = refused(RunArgs {
        grpc_addr: Some("nowhere".into()),
        ..Default::default()
    });
    assert!(matches!(err, ConfigError::NotAnAddress { .. }), "{err:?}");
    let err = refused(RunArgs {
        region: Some("a b".into()),
        ..Default::default()
    });
    assert!(matches!(err, ConfigError::Name(_)), "{err:?}");
    let err = refused(RunArgs {
        config: Some(PathBuf::from("/nonexistent/tally.toml")),
        ..Default::default()
    });
    assert!(
        matches!(&err, ConfigError::ReadFile { error, .. } if error.kind() == std::io::ErrorKind::NotFound),
        "{err:?}"
    );
    assert!(matches!(
        parse_duration("--sync-interval", "5y"),
        Err(ConfigError::UnknownUnit { .. })
    ));
}

#[test]
fn write_copies_take_two_to_the_maximum_and_name_the_setting_otherwise() {
    let resolve = |copies| {
        Settings::resolve(RunArgs {
            durability: Some(Durability::Replicated),
            write_copies: Some(copies),
            ..Default::default()
        })
    };
    let settings = resolve(3).unwrap();
    assert_eq!(
        (settings.durability, settings.write_copies),
        (Durability::Replicated, 3)
    );
    assert_eq!(Settings::defaults("d".into()).write_copies, 2);
    for bad in [0, 1, crate::engine::MAX_WRITE_COPIES + 1] {
        let err = resolve(bad).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("--write-copies {bad} is not valid"))
                && err.contains("give 2 to"),
            "{err}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tally.toml");
    std::fs::write(&path, "durability = \"replicated\"\nwrite_copies = 0\n").unwrap();
    let err = Settings::resolve(RunArgs {
        config: Some(path),
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("write_copies in"), "{err}");
}

#[test]
fn the_stronger_durability_wins() {
    use Durability::*;
    assert_eq!(Sync.stronger(Replicated), Replicated);
    assert_eq!(Replicated.stronger(Sync), Replicated);
    assert_eq!(Async.stronger(Sync), Sync);
    assert_eq!(Sync.stronger(Async), Sync);
}

#[test]
fn replication_factor_takes_one_to_the_maximum_and_names_the_setting_otherwise() {
    let resolve = |factor| {
        Settings::resolve(RunArgs {
            replication_factor: Some(factor),
            ..Default::default()
        })
    };
    assert_eq!(Settings::defaults("d".into()).replication_factor, 3);
    assert_eq!(resolve(1).unwrap().replication_factor, 1);
    assert_eq!(
        resolve(MAX_REPLICATION_FACTOR).unwrap().replication_factor,
        MAX_REPLICATION_FACTOR as u32
    );
    for bad in [0, MAX_REPLICATION_FACTOR + 1] {
        let err = resolve(bad).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("--replication-factor {bad} is not valid"))
                && err.contains("give 1 to 7"),
            "{err}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tally.toml");
    std::fs::write(&path, "replication_factor = 0\n").unwrap();
    let err = Settings::resolve(RunArgs {
        config: Some(path),
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("replication_factor in"), "{err}");
}

#[test]
fn dead_after_has_a_default_and_must_outlast_ten_gossip_intervals() {
    let resolve = |dead_after: &str, gossip: Option<&str>| {
        Settings::resolve(RunArgs {
            dead_after: Some(dead_after.into()),
            gossip_interval: gossip.map(Into::into),
            ..Default::default()
        })
    };
    assert_eq!(
        Settings::defaults("d".into()).dead_after,
        Duration::from_secs(300)
    );
    assert_eq!(
        resolve("3s", None).unwrap().dead_after,
        Duration::from_secs(3)
    );
    // Ten gossip intervals of 100 ms: 1 s is the floor.
    assert_eq!(
        resolve("1s", None).unwrap().dead_after,
        Duration::from_secs(1)
    );
    let err = resolve("999ms", None).unwrap_err().to_string();
    assert!(
        err.starts_with("--dead-after \"999ms\" is too short") && err.contains("1000 ms"),
        "{err}"
    );
    let err = resolve("5s", Some("1s")).unwrap_err().to_string();
    assert!(err.contains("10000 ms"), "{err}");
    assert!(matches!(
        resolve("soon", None),
        Err(ConfigError::NotADuration { setting, .. }) if setting == "--dead-after"
    ));
    // A gossip interval above a tenth of the default is refused too, naming --dead-after.
    let err = Settings::resolve(RunArgs {
        gossip_interval: Some("31s".into()),
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("--dead-after \"300000ms\" is too short"),
        "{err}"
    );
}

/// The configuration files the repository ships (systemd, each Kubernetes
/// region) name only settings the node knows, with values it accepts.
#[test]
fn the_shipped_configuration_files_parse() {
    let deploy = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let mut files = vec![deploy.join("systemd/tally.toml")];
    for region in ["eu-west", "us-east", "ap-south"] {
        files.push(deploy.join(format!("k8s/regions/{region}/tally.toml")));
    }
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let parsed = toml::from_str::<FileSettings>(&text);
        assert!(parsed.is_ok(), "{}: {:?}", file.display(), parsed.err());
    }
}
