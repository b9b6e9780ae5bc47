package main

import "testing"

// The peers' clients print these; the matrix reads msgs/s, p50 and p99.
func TestParsePeerOutputs(t *testing.T) {
	for _, c := range []struct {
		name     string
		parse    func(string) (*peerResult, error)
		out      string
		rate     float64
		p50, p99 int64
		wantErr  bool
	}{
		{name: "nats sync", parse: parseNatsBench, out: `22:42:23 Purging the stream

 NATS JetStream synchronous publisher aggregated stats: 18,508 msgs/sec ~ 18 MiB/sec
 message rates min 1,158 | avg 1,186 | max 1,220 | stddev 16 msgs
 latencies per operation min 612.23us | avg 6,792.55us | max 48,432.17us | stddev 9,176.44us | P50 4,550.51us | P90 13,795.10us | P99 33,359.86us | P99.9: 48,337.53us
`, rate: 18508, p50: 4550, p99: 33359},
		{name: "nats one client", parse: parseNatsBench, out: `23:21:28 [1] Starting JetStream synchronous publisher, publishing 1,000 messages

NATS JetStream synchronous publisher stats: 5,136 msgs/sec ~ 5.0 MiB/sec ~ min: 80.16us ~ avg: 194.08us ~ max: 4,921.60us ~ P50: 164.57us ~ P90: 249.09us ~ P99: 642.73us ~ P99.9: 4,921.60us
`, rate: 5136, p50: 164, p99: 642},
		{name: "nats per-client lines first", parse: parseNatsBench, out: `  [1] 147 msgs/sec ~ 148 KiB/sec ~ min: 675.19us ~ avg: 6,773.48us ~ max: 48,337.53us ~ P50: 4,499.03us ~ P90: 13,668.09us ~ P99: 33,357.86us ~ P99.9: 48,337.53us (500 msgs)
  [2] 147 msgs/sec ~ 147 KiB/sec ~ min: 713.15us ~ avg: 6,792.82us ~ max: 42,774.64us ~ P50: 4,443.23us ~ P90: 13,754.50us ~ P99: 33,374.16us ~ P99.9: 42,774.64us (500 msgs)

 NATS JetStream synchronous publisher aggregated stats: 294 msgs/sec ~ 294 KiB/sec
 message rates min 146 | avg 146 | max 147 | stddev 0 msgs
 latencies per operation min 612.23us | avg 6,792.55us | max 48,432.17us | stddev 9,176.44us | P50 4,550.51us | P90 13,795.10us | P99 33,359.86us | P99.9: 48,337.53us
`, rate: 294, p50: 4550, p99: 33359},
		{name: "nats without latencies", parse: parseNatsBench, out: " NATS JetStream asynchronous publisher aggregated stats: 132,000 msgs/sec ~ 128 MiB/sec\n", rate: 132000},
		{name: "nats error", parse: parseNatsBench, out: "nats: error: publishing: JS PubAsync ack timeout (pending=100)\n", wantErr: true},
		{name: "redis", parse: parseRedisBenchmark, out: `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"SET","41152.26","1.477","0.232","1.359","2.295","3.335","9.223"
`, rate: 41152.26, p50: 1359, p99: 3335},
		{name: "redis no SET row", parse: parseRedisBenchmark, out: "Could not connect to Redis at 127.0.0.1:1: Connection refused\n", wantErr: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := c.parse(c.out)
			if c.wantErr {
				if err == nil {
					t.Fatalf("got %+v, want an error", r)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.rate != c.rate || r.p50Us != c.p50 || r.p99Us != c.p99 {
				t.Fatalf("got rate %v p50 %d p99 %d, want %v %d %d", r.rate, r.p50Us, r.p99Us, c.rate, c.p50, c.p99)
			}
		})
	}
}
