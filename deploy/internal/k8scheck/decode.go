// Package k8scheck decodes and checks the Kubernetes objects that deploy/
// ships (the kustomize base and its mesh overlays, the Helm chart), offline:
// no cluster, no schema download. Every document is decoded strictly into
// its upstream Go type (k8s.io/api, prometheus-operator, istio.io/api,
// gateway-api), so a misspelt or misplaced field fails; Check then holds the
// objects to the facts of the storaged binary.
//
// It is imported only by the tests under deploy/.
package k8scheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	monv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	istionet "istio.io/api/networking/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// IstioObject is an Istio resource: Kubernetes metadata around an
// istio.io/api message, which is decoded with protojson (unknown fields
// fail), the way istiod reads it.
type IstioObject[T proto.Message] struct {
	metav1.TypeMeta
	metav1.ObjectMeta
	Spec T
}

// Objects holds every decoded object, by kind.
type Objects struct {
	StatefulSets     []*appsv1.StatefulSet
	Services         []*corev1.Service
	PDBs             []*policyv1.PodDisruptionBudget
	ConfigMaps       []*corev1.ConfigMap
	PodMonitors      []*monv1.PodMonitor
	ServiceMonitors  []*monv1.ServiceMonitor
	PrometheusRules  []*monv1.PrometheusRule
	VirtualServices  []*IstioObject[*istionet.VirtualService]
	DestinationRules []*IstioObject[*istionet.DestinationRule]
	GRPCRoutes       []*gatewayv1.GRPCRoute
}

// Clone returns a deep copy (the Istio specs included).
func (o *Objects) Clone() *Objects {
	c := &Objects{}
	for _, x := range o.StatefulSets {
		c.StatefulSets = append(c.StatefulSets, x.DeepCopy())
	}
	for _, x := range o.Services {
		c.Services = append(c.Services, x.DeepCopy())
	}
	for _, x := range o.PDBs {
		c.PDBs = append(c.PDBs, x.DeepCopy())
	}
	for _, x := range o.ConfigMaps {
		c.ConfigMaps = append(c.ConfigMaps, x.DeepCopy())
	}
	for _, x := range o.PodMonitors {
		c.PodMonitors = append(c.PodMonitors, x.DeepCopy())
	}
	for _, x := range o.ServiceMonitors {
		c.ServiceMonitors = append(c.ServiceMonitors, x.DeepCopy())
	}
	for _, x := range o.PrometheusRules {
		c.PrometheusRules = append(c.PrometheusRules, x.DeepCopy())
	}
	for _, x := range o.VirtualServices {
		c.VirtualServices = append(c.VirtualServices, cloneIstio(x))
	}
	for _, x := range o.DestinationRules {
		c.DestinationRules = append(c.DestinationRules, cloneIstio(x))
	}
	for _, x := range o.GRPCRoutes {
		c.GRPCRoutes = append(c.GRPCRoutes, x.DeepCopy())
	}
	return c
}

func cloneIstio[T proto.Message](x *IstioObject[T]) *IstioObject[T] {
	return &IstioObject[T]{TypeMeta: x.TypeMeta, ObjectMeta: *x.ObjectMeta.DeepCopy(), Spec: proto.Clone(x.Spec).(T)}
}

// Count is the number of objects held.
func (o *Objects) Count() int {
	return len(o.StatefulSets) + len(o.Services) + len(o.PDBs) + len(o.ConfigMaps) + len(o.PodMonitors) +
		len(o.ServiceMonitors) + len(o.PrometheusRules) + len(o.VirtualServices) + len(o.DestinationRules) + len(o.GRPCRoutes)
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*(#.*)?$`)

// DecodeStream splits a YAML stream on "---" lines and strictly decodes
// every non-empty document into o.
func DecodeStream(name string, data []byte, o *Objects) error {
	for i, doc := range docSeparator.Split(string(data), -1) {
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			return fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		if t := bytes.TrimSpace(j); len(t) == 0 || string(t) == "null" {
			continue // only comments or blank
		}
		if err := decodeDocument([]byte(doc), o); err != nil {
			return fmt.Errorf("%s: document %d: %w", name, i, err)
		}
	}
	return nil
}

// decodeDocument picks the Go type by apiVersion and kind and decodes
// strictly: unknown or duplicate fields fail.
func decodeDocument(doc []byte, o *Objects) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	type kindKey struct{ apiVersion, kind string }
	var obj any
	switch (kindKey{tm.APIVersion, tm.Kind}) {
	case kindKey{"apps/v1", "StatefulSet"}:
		obj = appendNew(&o.StatefulSets)
	case kindKey{"v1", "Service"}:
		obj = appendNew(&o.Services)
	case kindKey{"policy/v1", "PodDisruptionBudget"}:
		obj = appendNew(&o.PDBs)
	case kindKey{"v1", "ConfigMap"}:
		obj = appendNew(&o.ConfigMaps)
	case kindKey{"monitoring.coreos.com/v1", "PodMonitor"}:
		obj = appendNew(&o.PodMonitors)
	case kindKey{"monitoring.coreos.com/v1", "ServiceMonitor"}:
		obj = appendNew(&o.ServiceMonitors)
	case kindKey{"monitoring.coreos.com/v1", "PrometheusRule"}:
		obj = appendNew(&o.PrometheusRules)
	case kindKey{"gateway.networking.k8s.io/v1", "GRPCRoute"}:
		obj = appendNew(&o.GRPCRoutes)
	case kindKey{"networking.istio.io/v1", "VirtualService"}:
		x := &IstioObject[*istionet.VirtualService]{Spec: &istionet.VirtualService{}}
		o.VirtualServices = append(o.VirtualServices, x)
		return decodeIstio(doc, &x.TypeMeta, &x.ObjectMeta, x.Spec)
	case kindKey{"networking.istio.io/v1", "DestinationRule"}:
		x := &IstioObject[*istionet.DestinationRule]{Spec: &istionet.DestinationRule{}}
		o.DestinationRules = append(o.DestinationRules, x)
		return decodeIstio(doc, &x.TypeMeta, &x.ObjectMeta, x.Spec)
	default:
		return fmt.Errorf("unexpected apiVersion %q kind %q (add it to decodeDocument with its checks)", tm.APIVersion, tm.Kind)
	}
	return decodeStrict(doc, obj)
}

func appendNew[T any](list *[]*T) *T {
	x := new(T)
	*list = append(*list, x)
	return x
}

// decodeStrict decodes doc into obj the way the API server does.
func decodeStrict(doc []byte, obj any) error {
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return err
	}
	// yaml.UnmarshalStrict goes through encoding/json, which matches field names case-insensitively
	// ("clusterIp" fills ClusterIP). The API server does not: decode again the way it does.
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strictErrs, err := sigsjson.UnmarshalStrict(j, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

// decodeIstio decodes the envelope strictly and the spec with protojson.
func decodeIstio(doc []byte, tm *metav1.TypeMeta, meta *metav1.ObjectMeta, spec proto.Message) error {
	var env struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
		Spec              json.RawMessage `json:"spec"`
	}
	if err := decodeStrict(doc, &env); err != nil {
		return err
	}
	*tm, *meta = env.TypeMeta, env.ObjectMeta
	if len(env.Spec) == 0 {
		return errors.New("no spec")
	}
	return protojson.UnmarshalOptions{DiscardUnknown: false}.Unmarshal(env.Spec, spec)
}
