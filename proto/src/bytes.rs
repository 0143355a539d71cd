//! Byte counts as people read them. One format on both ends of the
//! protocol: tierd's decision details (`Decision.detail`, written by
//! tier-controller) and tierctl's columns print the same sizes.

/// Bytes as a short binary size: 16.0M, 512K, 3.5G.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("T", 1 << 40),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
    ];
    for (u, scale) in UNITS {
        if b >= scale {
            return format!("{:.1}{u}", b as f64 / scale as f64);
        }
    }
    format!("{b}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human_bytes(0), "0B");
        assert_eq!(human_bytes(16 << 20), "16.0M");
        assert_eq!(human_bytes(1536), "1.5K");
        assert_eq!(human_bytes(3 << 30), "3.0G");
    }
}
