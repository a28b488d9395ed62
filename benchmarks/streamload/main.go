// Command streamload measures what a proxy adds to LLM-style streams: an upstream that
// answers every chat completion with `stream: true` as server-sent events, one chunk every
// -interval for -duration, each chunk stamped with the wall-clock time it was written; and
// a client that opens -streams such streams at once (through the proxy, or directly) and
// records, for every chunk, how long after its stamp it arrived. Processes on one machine
// share the wall clock, so direct and proxied delays compare like for like.
//
//	streamload upstream -listen 127.0.0.1:9000 -interval 20ms -duration 30s
//	streamload client -url http://127.0.0.1:8080/v1/chat/completions -streams 1000
//
// The client prints one JSON object: chunks, streams completed, errors, and the chunk
// delay's p50, p90, p99 and max in microseconds. Standard library only.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		log.Fatal("usage: streamload upstream|client [flags]")
	}
	switch os.Args[1] {
	case "upstream":
		upstream(os.Args[2:])
	case "client":
		client(os.Args[2:])
	default:
		log.Fatalf("unknown mode %q", os.Args[1])
	}
}

func upstream(args []string) {
	fs := flag.NewFlagSet("upstream", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:9000", "address to listen on")
	interval := fs.Duration("interval", 20*time.Millisecond, "time between chunks")
	duration := fs.Duration("duration", 30*time.Second, "how long each stream lasts")
	_ = fs.Parse(args)
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		flusher, ok := w.(http.Flusher)
		if !ok {
			http.Error(w, "no flusher", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		flusher.Flush()
		ticker := time.NewTicker(*interval)
		defer ticker.Stop()
		end := time.Now().Add(*duration)
		for n := 0; time.Now().Before(end); n++ {
			<-ticker.C
			chunk := fmt.Sprintf("data: {\"object\":\"chat.completion.chunk\",\"model\":\"coder\","+
				"\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"}}],\"ts\":%d}\n\n",
				n, time.Now().UnixNano())
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
			flusher.Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
		flusher.Flush()
	})
	server := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(server.ListenAndServe())
}

type result struct {
	Streams  int     `json:"streams"`
	Done     int64   `json:"done"`
	Errors   int64   `json:"errors"`
	Chunks   int     `json:"chunks"`
	P50us    float64 `json:"p50_us"`
	P90us    float64 `json:"p90_us"`
	P99us    float64 `json:"p99_us"`
	MaxUs    float64 `json:"max_us"`
	FirstErr string  `json:"first_error,omitempty"`
}

func client(args []string) {
	fs := flag.NewFlagSet("client", flag.ExitOnError)
	url := fs.String("url", "http://127.0.0.1:8080/v1/chat/completions", "where to POST")
	streams := fs.Int("streams", 1000, "concurrent streams")
	ramp := fs.Duration("ramp", 2*time.Second, "spread the streams' starts over this long")
	skip := fs.Duration("skip", 3*time.Second, "ignore chunks stamped this soon after the start (ramp-up)")
	_ = fs.Parse(args)
	transport := &http.Transport{
		MaxIdleConns: *streams, MaxIdleConnsPerHost: *streams, MaxConnsPerHost: 0,
		DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
	}
	httpClient := &http.Client{Transport: transport}
	body := []byte(`{"model":"coder","messages":[{"role":"user","content":"hi"}],"stream":true}`)
	start := time.Now()
	from := start.Add(*skip).UnixNano()
	var (
		mu       sync.Mutex
		delays   []float64
		done     atomic.Int64
		errs     atomic.Int64
		firstErr atomic.Value
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		errs.Add(1)
		firstErr.CompareAndSwap(nil, err.Error())
	}
	for i := 0; i < *streams; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			time.Sleep(time.Duration(int64(*ramp) * int64(i) / int64(*streams)))
			resp, err := httpClient.Post(*url, "application/json", bytes.NewReader(body))
			if err != nil {
				fail(err)
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				fail(fmt.Errorf("status %d", resp.StatusCode))
				return
			}
			local := make([]float64, 0, 2048)
			reader := bufio.NewReaderSize(resp.Body, 16384)
			for {
				line, err := reader.ReadString('\n')
				if err != nil {
					if err != io.EOF {
						fail(err)
					}
					break
				}
				now := time.Now().UnixNano()
				if !strings.HasPrefix(line, "data: {") {
					if strings.HasPrefix(line, "data: [DONE]") {
						done.Add(1)
					}
					continue
				}
				at := strings.LastIndex(line, `"ts":`)
				if at < 0 {
					continue
				}
				stamp, err := strconv.ParseInt(strings.TrimRight(line[at+5:], "}\n"), 10, 64)
				if err != nil || stamp < from {
					continue
				}
				local = append(local, float64(now-stamp)/1e3)
			}
			mu.Lock()
			delays = append(delays, local...)
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	sort.Float64s(delays)
	pick := func(q float64) float64 {
		if len(delays) == 0 {
			return 0
		}
		return delays[int(q*float64(len(delays)-1))]
	}
	out := result{Streams: *streams, Done: done.Load(), Errors: errs.Load(), Chunks: len(delays),
		P50us: pick(0.5), P90us: pick(0.9), P99us: pick(0.99), MaxUs: pick(1)}
	if v := firstErr.Load(); v != nil {
		out.FirstErr = v.(string)
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
}
