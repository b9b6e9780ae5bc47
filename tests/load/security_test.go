package load

import (
	"context"
	"io/fs"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/server"
	"github.com/storaged/storaged/storage"
)

// TestNoFileOutsideDataDir throws path-traversal topics and hostile
// properties at a real server, then walks the directory around the data
// dir: every file lies inside it, and every consume-queue directory is a
// valid topic name.
func TestNoFileOutsideDataDir(t *testing.T) {
	parent := t.TempDir()
	dataDir := filepath.Join(parent, "data")
	st, err := storage.Open(storage.Options{Dir: dataDir, FileSize: 1 << 20, MaxMessageSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	gs, err := server.NewGRPCServer(server.New(st, zerolog.Nop()), server.GRPCConfig{Logger: zerolog.Nop(), MaxMessageSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	gs.SetServing(true)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	defer gs.Shutdown(5 * time.Second)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := storagedv1.NewMessageStoreServiceClient(conn)
	hostile := []string{"../escape", "..", "../../etc/passwd", "a/b", "/abs", "%2e%2e", "%2e%2e%2fx", "%252e%252e",
		"a\x00b", "Tоpic", "ｔｏｐｉｃ", "con\\x", strings.Repeat("a", 128), ".", "", "a b", "topic\n"}
	for _, topic := range hostile {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: topic, Body: []byte("x"),
			Properties: map[string]string{"path": "../../x"}}})
		cancel()
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("topic %q: %v, want INVALID_ARGUMENT", topic, err)
		}
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		_, err = client.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: topic})
		cancel()
		if c := status.Code(err); c != codes.InvalidArgument && c != codes.NotFound {
			t.Errorf("pull of topic %q: %v", topic, err)
		}
	}
	// A legal topic with the same hostile property value is stored as data.
	if _, err := client.PutMessage(context.Background(), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{
		Topic: "ok_Topic-1", Body: []byte("x"), Properties: map[string]string{"path": "../../x"}}}); err != nil {
		t.Fatal(err)
	}
	validTopic := regexp.MustCompile(`^[%|a-zA-Z0-9_-]+$`)
	filepath.WalkDir(parent, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Errorf("walk: %v", err)
			return nil
		}
		rel, _ := filepath.Rel(parent, p)
		if rel != "." && rel != "data" && !strings.HasPrefix(rel, "data"+string(filepath.Separator)) {
			t.Errorf("file outside the data dir: %s", rel)
		}
		if parts := strings.Split(rel, string(filepath.Separator)); len(parts) >= 3 && parts[1] == "consumequeue" &&
			!validTopic.MatchString(parts[2]) {
			t.Errorf("consume-queue directory for an invalid topic: %s", rel)
		}
		return nil
	})
}
