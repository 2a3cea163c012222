//! How long the checker takes on a correct history of about 100,000 records
//! (and 10x that): 20 clients in two groups, every service type, a view
//! change every 200 sends. Run: `cargo bench -p shoal-check`.
//! It prints the history's size and the best and median of several runs.

use std::time::Instant;

use shoal_check::{check, Record, Service};

/// A small deterministic generator (xorshift64), so the history is the
/// same every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One global sequence of events, as the ideal model in `tests/model.rs`.
fn history(clients: usize, target: usize) -> Vec<Record> {
    let names: Vec<String> = (0..clients).map(|i| format!("#c{i}#d{}", i % 5)).collect();
    let groups = ["g", "h"];
    let mut members: Vec<Vec<usize>> = vec![(0..clients).collect(), (0..clients / 2).collect()];
    let mut view_id = [0u64; 2];
    let mut seq = vec![0u64; clients];
    let mut out = Vec::with_capacity(target + clients * 4);
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let install = |g: usize, members: &[usize], id: u64, out: &mut Vec<Record>| {
        let ms: Vec<&str> = members.iter().map(|&m| names[m].as_str()).collect();
        for &m in members {
            out.push(Record::view(&names[m], groups[g], id, &ms));
        }
    };
    for g in 0..2 {
        view_id[g] += 1;
        install(g, &members[g], view_id[g], &mut out);
    }
    let mut sends = 0u64;
    while out.len() < target {
        sends += 1;
        if sends.is_multiple_of(200) {
            // One client leaves or joins h.
            let g = 1;
            let c = rng.below(clients as u64) as usize;
            match members[g].iter().position(|&m| m == c) {
                Some(i) if members[g].len() > 1 => {
                    members[g].remove(i);
                }
                Some(_) => continue,
                None => {
                    members[g].push(c);
                    members[g].sort_unstable();
                }
            }
            view_id[g] += 1;
            install(g, &members[g], view_id[g], &mut out);
        }
        let g = rng.below(2) as usize;
        let sender = members[g][rng.below(members[g].len() as u64) as usize];
        let service = Service::ALL[rng.below(7) as usize];
        seq[sender] += 1;
        out.push(Record::send(
            &names[sender],
            seq[sender],
            service,
            &[groups[g]],
        ));
        for &r in &members[g] {
            out.push(Record::deliver(
                &names[r],
                &names[sender],
                seq[sender],
                service,
                &[groups[g]],
            ));
        }
    }
    out
}

fn measure(records: usize, runs: usize) {
    let h = history(20, records);
    let mut times = Vec::new();
    for _ in 0..runs {
        let h = h.clone();
        let t = Instant::now();
        let report = check(h);
        times.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(report.is_clean(), "{report}");
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{} records (20 clients, 2 groups): best {:.1} ms, median {:.1} ms over {runs} runs",
        h.len(),
        times[0],
        times[runs / 2]
    );
}

fn main() {
    measure(100_000, 7);
    measure(1_000_000, 3);
}
