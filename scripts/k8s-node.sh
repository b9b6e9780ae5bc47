#!/usr/bin/env bash
# A one-node Kubernetes built from source, to run storaged's Helm chart for
# real where no cluster, no container registry and no Docker engine are at
# hand (README "A real run on Kubernetes"). Needs root, Linux with cgroups,
# overlayfs, bridge and iptables, Go, openssl, python3, and Debian's
# containerd, runc, containernetworking-plugins, iptables and conntrack
# (apt-get install them first). Everything else comes from the Go module
# proxy: Kubernetes (kube-apiserver, controller-manager, scheduler, kubelet,
# kube-proxy, kubectl), etcd (embedded in a small program) and CoreDNS.
#
#   scripts/k8s-node.sh build                 build the binaries (once; ~10 min on 2 cores)
#   scripts/k8s-node.sh up                    start containerd and the node
#   scripts/k8s-node.sh deploy                storaged's image (ko, storaged-image ci) and the chart: a group of 3
#   scripts/k8s-node.sh scenario NAME DUR AT  soak through the Service; at AT s: term (delete the leader pod),
#                                             kill (kill -9 the leader), follower (kill -9 a follower),
#                                             rollout (rolling restart)
#   scripts/k8s-node.sh down                  stop everything (the data stays in $K8S_DIR)
#
# Not for production: one node, etcd without fsync, the admin certificate
# for every component, pods' DNS served by a CoreDNS on the host.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
K=${K8S_DIR:-${TMPDIR:-/tmp}/storaged-k8s}
KUBE_VERSION=${KUBE_VERSION:-v1.32.13}
ETCD_VERSION=${ETCD_VERSION:-v3.5.36}
COREDNS_VERSION=${COREDNS_VERSION:-v1.12.4}
NODE_IP=10.88.0.1 # the pods' bridge (cni0): the node, the API server and the DNS server
NS=store
B=$K/bin P=$K/pki R=$K/run
export KUBECONFIG=$K/admin.kubeconfig
kubectl() { "$B/kubectl" "$@"; }

build() {
	mkdir -p "$B" "$K/src"
	# Kubernetes: the module's replace directives point at staging/, which
	# the module proxy's zip leaves out; point them at the published
	# staging modules instead (endpointslice's patch release lags).
	local dir
	dir=$(cd "$K/src" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["Dir"])')
	rm -rf "$K/src/kubernetes" && cp -r "$dir" "$K/src/kubernetes" && chmod -R u+w "$K/src/kubernetes"
	local minor=${KUBE_VERSION#v1.}
	(
		cd "$K/src/kubernetes"
		rm -f go.work go.work.sum
		sed -i -E "s#^(\s*)(k8s\.io/[a-z0-9-]+) => \./staging/src/k8s\.io/[a-z0-9-]+#\1\2 => \2 v0.$minor#" go.mod
		sed -i -E '/k8s\.io\/sample-(apiserver|cli-plugin|controller)/d' go.mod
		if ! go mod download "k8s.io/endpointslice@v0.$minor" >/dev/null 2>&1; then
			sed -i -E "s#k8s.io/endpointslice => k8s.io/endpointslice v0\.[0-9.]+#k8s.io/endpointslice => k8s.io/endpointslice v0.${minor%.*}.$((${minor##*.} - 1))#" go.mod
		fi
		local ld="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1"
		ld+=" -X k8s.io/component-base/version.gitMinor=${minor%%.*} -X k8s.io/component-base/version.gitTreeState=clean"
		ld+=" -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION"
		for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
			[ -x "$B/$c" ] && continue
			echo "== $c"
			GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$B/$c" "./cmd/$c"
		done
	)
	# etcd, embedded: its own module's replace directives keep `go install` out.
	mkdir -p "$K/src/etcd"
	cat >"$K/src/etcd/main.go" <<'EOF'
// Command etcd runs a one-member etcd on loopback, without fsync: a test node only.
package main

import (
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	cfg := embed.NewConfig()
	cfg.Dir = os.Args[1]
	c, _ := url.Parse("http://127.0.0.1:2379")
	p, _ := url.Parse("http://127.0.0.1:2380")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*c}, []url.URL{*c}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*p}, []url.URL{*p}
	cfg.InitialCluster = cfg.Name + "=" + p.String()
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatal(err)
	}
	<-e.Server.ReadyNotify()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
	case err := <-e.Err():
		log.Print(err)
	}
	e.Close()
}
EOF
	printf 'module etcdrun\n\ngo 1.23\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$K/src/etcd/go.mod"
	(cd "$K/src/etcd" && GOFLAGS=-mod=mod go mod tidy && CGO_ENABLED=0 go build -o "$B/etcd" .)
	# The pods' sandbox image: a pause program in a one-layer image.
	mkdir -p "$K/src/pause/cmd"
	cat >"$K/src/pause/cmd/main.go" <<'EOF'
// Command pause holds a pod's namespaces until it is told to stop.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	<-c
}
EOF
	cat >"$K/src/pause/main.go" <<'EOF'
// Command pauseimage writes the pause binary as a one-layer image tarball.
package main

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"os"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	data, err := os.ReadFile(os.Args[1])
	if err != nil {
		log.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "pause", Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg})
	tw.Write(data)
	tw.Close()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		log.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		log.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Config = v1.Config{Entrypoint: []string{"/pause"}, User: "65535:65535"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		log.Fatal(err)
	}
	tag, _ := name.NewTag("registry.k8s.io/pause:3.10")
	if err := tarball.WriteToFile(os.Args[2], tag, img); err != nil {
		log.Fatal(err)
	}
}
EOF
	local cr
	cr=$(cd "$REPO" && go list -m -f '{{.Version}}' github.com/google/go-containerregistry)
	printf 'module pauseimage\n\ngo 1.26.0\n\nrequire github.com/google/go-containerregistry %s\n' "$cr" >"$K/src/pause/go.mod"
	(cd "$K/src/pause" && GOFLAGS=-mod=mod go mod tidy && CGO_ENABLED=0 go build -o "$B/pause" ./cmd &&
		go run . "$B/pause" "$K/pause.tar")
	GOBIN=$B CGO_ENABLED=0 go install "github.com/coredns/coredns@$COREDNS_VERSION"
	(cd "$REPO" && go build -o "$B/storaged-bench" ./cmd/storaged-bench)
}

pki() {
	[ -f "$P/admin.crt" ] && return
	mkdir -p "$P"
	openssl req -x509 -newkey rsa:2048 -nodes -keyout "$P/ca.key" -out "$P/ca.crt" -days 30 -subj /CN=storaged-k8s-node-ca 2>/dev/null
	sign() { # name subject [subjectAltName]
		openssl req -newkey rsa:2048 -nodes -keyout "$P/$1.key" -out "$P/$1.csr" -subj "$2" 2>/dev/null
		if [ -n "${3:-}" ]; then
			printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$3" >"$P/$1.ext"
		else
			printf 'extendedKeyUsage=clientAuth\n' >"$P/$1.ext"
		fi
		openssl x509 -req -in "$P/$1.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -out "$P/$1.crt" -days 30 \
			-extfile "$P/$1.ext" 2>/dev/null
	}
	sign apiserver /CN=kube-apiserver \
		"IP:127.0.0.1,IP:$NODE_IP,IP:10.96.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	sign admin "/O=system:masters/CN=admin"
	# The group's peer certificate (mTLS between the pods), for the chart's replication.tlsSecretName.
	sign peer /CN=storaged-peer "DNS:*.storaged-headless.$NS.svc,DNS:*.storaged-headless.$NS.svc.cluster.local"
	openssl genrsa -out "$P/sa.key" 2048 2>/dev/null
	openssl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub" 2>/dev/null
}

start() { # name command...: start once, in the background, logging to $R/name.log
	local n=$1
	shift
	pgrep -f "^$1 " >/dev/null && return 0
	setsid nohup "$@" >"$R/$n.log" 2>&1 </dev/null &
}

up() {
	pki
	mkdir -p "$R" /etc/containerd /etc/cni/net.d /var/lib/kubelet
	ip link show cni0 >/dev/null 2>&1 || { ip link add cni0 type bridge && ip addr add $NODE_IP/16 dev cni0; }
	ip link set cni0 up
	sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
	cat >/etc/cni/net.d/10-bridge.conflist <<EOF
{"cniVersion":"0.4.0","name":"k8s","plugins":[
 {"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":true,"hairpinMode":true,
  "ipam":{"type":"host-local","ranges":[[{"subnet":"10.88.0.0/16","rangeStart":"10.88.1.1","gateway":"$NODE_IP"}]],"routes":[{"dst":"0.0.0.0/0"}]}},
 {"type":"portmap","capabilities":{"portMappings":true}}]}
EOF
	# A machine that withholds CAP_SYS_RESOURCE (a sandbox's root) cannot
	# give a process a negative oom_score_adj, which the kubelet asks for
	# every pod sandbox (-998): runc then fails "can't get final child's
	# PID from pipe". The wrapper raises such a score to 0.
	cat >"$B/runc-wrap" <<'EOF'
#!/bin/bash
for ((i = 1; i <= $#; i++)); do
	if [ "${!i}" = --bundle ]; then
		j=$((i + 1))
		python3 -c 'import json,sys
p=sys.argv[1]+"/config.json"; c=json.load(open(p)); pr=c.get("process",{})
if pr.get("oomScoreAdj",0)<0: pr["oomScoreAdj"]=0; json.dump(c,open(p,"w"))' "${!j}"
	fi
done
exec runc "$@"
EOF
	chmod +x "$B/runc-wrap"
	containerd config default |
		sed -e 's#bin_dir = "/opt/cni/bin"#bin_dir = "/usr/lib/cni"#' \
			-e 's#sandbox_image = "registry.k8s.io/pause:[0-9.]*"#sandbox_image = "registry.k8s.io/pause:3.10"#' \
			-e "s#BinaryName = \"\"#BinaryName = \"$B/runc-wrap\"#" >/etc/containerd/config.toml
	pgrep -x containerd >/dev/null || { setsid nohup containerd >"$R/containerd.log" 2>&1 </dev/null & }
	for _ in $(seq 50); do ctr version >/dev/null 2>&1 && break; sleep 0.2; done
	ctr -n k8s.io images import "$K/pause.tar" >/dev/null
	cat >"$K/admin.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://$NODE_IP:6443", certificate-authority: $P/ca.crt}}]
users: [{name: admin, user: {client-certificate: $P/admin.crt, client-key: $P/admin.key}}]
contexts: [{name: local, context: {cluster: local, user: admin}}]
current-context: local
EOF
	start etcd "$B/etcd" "$K/etcd-data"
	for _ in $(seq 50); do curl -fs http://127.0.0.1:2379/health >/dev/null && break; sleep 0.2; done
	start apiserver "$B/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 --advertise-address=$NODE_IP \
		--bind-address=0.0.0.0 --secure-port=6443 --service-cluster-ip-range=10.96.0.0/16 --allow-privileged=true \
		--authorization-mode=Node,RBAC --client-ca-file="$P/ca.crt" --tls-cert-file="$P/apiserver.crt" \
		--tls-private-key-file="$P/apiserver.key" --kubelet-preferred-address-types=InternalIP \
		--kubelet-client-certificate="$P/admin.crt" --kubelet-client-key="$P/admin.key" \
		--service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$P/sa.pub" \
		--service-account-signing-key-file="$P/sa.key"
	for _ in $(seq 300); do kubectl get --raw /readyz >/dev/null 2>&1 && break; sleep 0.2; done
	start controller-manager "$B/kube-controller-manager" --kubeconfig="$KUBECONFIG" --leader-elect=false \
		--service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" --cluster-cidr=10.88.0.0/16 \
		--use-service-account-credentials=false --controllers='*,-nodeipam'
	start scheduler "$B/kube-scheduler" --kubeconfig="$KUBECONFIG" --leader-elect=false
	cat >"$K/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
clusterDNS: [$NODE_IP]
clusterDomain: cluster.local
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}, x509: {clientCAFile: $P/ca.crt}}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
EOF
	start kubelet "$B/kubelet" --config="$K/kubelet.yaml" --kubeconfig="$KUBECONFIG" --node-ip=$NODE_IP --hostname-override=node1
	cat >"$K/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $KUBECONFIG}
mode: iptables
clusterCIDR: 10.88.0.0/16
hostnameOverride: node1
conntrack: {maxPerCore: 0}
EOF
	start kube-proxy "$B/kube-proxy" --config="$K/kube-proxy.yaml"
	local upstream
	upstream=$(awk '$1 == "nameserver" && $2 != "'$NODE_IP'" {print $2; exit}' /etc/resolv.conf)
	cat >"$K/Corefile" <<EOF
.:53 {
    bind $NODE_IP
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $KUBECONFIG local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    forward . $upstream
    cache 5
}
EOF
	start coredns "$B/coredns" -conf "$K/Corefile"
	# The host resolves the pods' names too (the soak's --members); the
	# original file is kept beside it and put back by down.
	[ -f "$K/resolv.conf.orig" ] || cp /etc/resolv.conf "$K/resolv.conf.orig"
	printf 'search %s.svc.cluster.local svc.cluster.local cluster.local\nnameserver %s\nnameserver %s\n' $NS $NODE_IP "$upstream" >/etc/resolv.conf
	for _ in $(seq 150); do kubectl get node node1 >/dev/null 2>&1 && break; sleep 0.2; done
	kubectl wait --for=condition=Ready node/node1 --timeout=2m
}

deploy() {
	# The image as CI builds it: ko on the pinned base, no registry.
	local work
	work=$(cd "$REPO" && go run ./cmd/storaged-image ci -keep | awk '/work directory kept:/ {print $NF}')
	ctr -n k8s.io images import "$work/storaged-1.tar" >/dev/null
	rm -rf "$work"
	kubectl get namespace $NS >/dev/null 2>&1 || kubectl create namespace $NS
	kubectl -n $NS get secret storaged-peer-tls >/dev/null 2>&1 ||
		kubectl -n $NS create secret generic storaged-peer-tls --type=kubernetes.io/tls \
			--from-file=tls.crt="$P/peer.crt" --from-file=tls.key="$P/peer.key" --from-file=ca.crt="$P/ca.crt"
	# Three hostPath volumes (no provisioner on this node), owned by the image's user.
	for i in 0 1 2; do
		mkdir -p "$K/pv/$i" && chown 65532:65532 "$K/pv/$i"
		kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: {name: storaged-pv-$i}
spec:
  capacity: {storage: 20Gi}
  accessModes: [ReadWriteOnce]
  storageClassName: k8s-node
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: $K/pv/$i, type: Directory}
EOF
	done
	# The chart as README "Install with Helm" has it, with replication on;
	# requests fit the node's 2 CPUs.
	(cd "$REPO" && go tool -modfile=tools/deploy/go.mod helm template storaged deploy/helm/storaged --namespace $NS \
		--kube-version "${KUBE_VERSION#v}" --set image.repository=storaged --set image.tag=latest --set replicas=3 \
		--set replication.enabled=true --set replication.bootstrapReplicas=3 --set replication.tlsSecretName=storaged-peer-tls \
		--set flush.mode=sync --set storage.className=k8s-node --set storage.size=20Gi \
		--set resources.requests.cpu=200m --set resources.requests.memory=1Gi) | kubectl -n $NS apply -f -
	kubectl -n $NS rollout status statefulset/storaged --timeout=5m
}

leader() { # the leading pod as name=ip, asked of each pod's metrics
	local p
	for _ in $(seq 50); do
		for p in $(kubectl -n $NS get pods -o jsonpath='{range .items[*]}{.metadata.name}={.status.podIP}{" "}{end}'); do
			curl -s --max-time 2 "${p#*=}:9091/metrics" | grep -q '^storaged_raft_is_leader 1' && echo "$p" && return 0
		done
		sleep 0.2
	done
	return 1
}

scenario() { # NAME DURATION AT: a soak through the Service, one disruption AT seconds in
	local name=$1 dur=$2 at=$3 out=$K/results
	mkdir -p "$out"
	local svc members=""
	svc=$(kubectl -n $NS get svc storaged -o jsonpath='{.spec.clusterIP}')
	for i in 0 1 2; do members+="storaged-$i.storaged-headless.$NS.svc.cluster.local:9090,"; done
	"$B/storaged-bench" soak --targets "$svc:9090" --members "${members%,}" --duration "$dur" --verify-wait 3m \
		--out "$out/$name.json" >"$out/$name.log" 2>&1 &
	local soak=$! l rc=0
	# Whatever the disruption does, the soak is waited for (and checks).
	(
		set +e
		sleep "$at"
		l=$(leader) || { echo "no leader found"; exit 1; }
		echo "$(date -u +%T.%3N) leader ${l%=*} (${l#*=})"
		case $name in
		term*) kubectl -n $NS delete pod "${l%=*}" --wait=false ;;
		kill*) for pid in $(pgrep -f '^/ko-app/storaged'); do
			if grep -qz "^POD_IP=${l#*=}$" "/proc/$pid/environ"; then kill -9 "$pid" && echo "kill -9 $pid"; fi
		done ;;
		follower*) for pid in $(pgrep -f '^/ko-app/storaged'); do # one follower, killed and restarted: its catch-up
			if ! grep -qz "^POD_IP=${l#*=}$" "/proc/$pid/environ"; then kill -9 "$pid" && echo "kill -9 $pid (a follower)" && break; fi
		done ;;
		rollout*) kubectl -n $NS rollout restart statefulset/storaged ;;
		esac 2>&1 | sed "s/^/$(date -u +%T.%3N) /"
	) | tee "$out/$name.events" || rc=1
	wait $soak || rc=$?
	grep '^soak:' "$out/$name.log"
	python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('gaps', [(g['start'][11:23], g['ms']) for g in r['gaps']])" "$out/$name.json"
	kubectl -n $NS get pods -o wide
	return $rc
}

down() {
	for p in coredns kube-proxy kubelet scheduler controller-manager apiserver; do pkill -f "^$B/.*$p" || true; done
	kubectl -n $NS delete statefulset storaged --wait=false >/dev/null 2>&1 || true
	pkill -f "^$B/kube" || true
	pkill -f "^$B/etcd " || true
	for c in $(ctr -n k8s.io tasks ls -q 2>/dev/null); do ctr -n k8s.io tasks kill -s KILL "$c" >/dev/null 2>&1 || true; done
	pkill -f containerd-shim-runc-v2 || true
	pkill -x containerd || true
	[ -f "$K/resolv.conf.orig" ] && cp "$K/resolv.conf.orig" /etc/resolv.conf && rm "$K/resolv.conf.orig"
	return 0
}

case ${1:-} in
build | up | deploy | down) "$1" ;;
scenario) shift && scenario "$@" ;;
*) sed -n '2,18p' "$0" && exit 2 ;;
esac
