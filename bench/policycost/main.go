// Command policycost measures the least the apiserver (Kubernetes 1.36, the pinned module)
// spends on a pod write for each ValidatingAdmissionPolicy binding that matches it, before the
// policy's matchConditions are read: k8s.io/apiserver's cel.newActivation converts the pod and
// its old copy to unstructured maps (runtime.DefaultUnstructuredConverter), which this times.
// Not timed: the conversion of both from the internal to the v1 type and of the admission
// request, and, when the matchConditions pass, the same conversions again for the
// validations. So a policy matching pods/status costs every kubelet's status write at least
// two of these.
//
//	cd bench/policycost && go run .
package main

import (
	"fmt"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// runningPod is a trimmed pod as a Job creates it, placed by gpushare and running: labels,
// owner, the service account token volume, default tolerations, conditions and a container
// status; without managedFields and the fields the apiserver defaults, which a real pod has
// and which make its conversion dearer: the figure is a floor.
func runningPod() *corev1.Pod {
	yes := true
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "train-7x2kq", Namespace: "team-a", UID: "8c1e4b2a-0d6f-4c3e-9a57-2b1f0e9d7c64",
			Labels: map[string]string{
				"batch.kubernetes.io/job-name": "train", "job-name": "train",
				"batch.kubernetes.io/controller-uid": "1f0e9d7c-2b1f-4c3e-9a57-8c1e4b2a0d6f",
			},
			Annotations: map[string]string{
				"volcano.sh/gpu-index": "3", "volcano.sh/predicate-time": "1765080000000000000",
				"volcano.sh/gpu-assigned": "true", "gpushare.io/memory-unit-mib": "512",
				"gpushare.io/gpu-memory-mib": "1024",
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "batch/v1", Kind: "Job", Name: "train", UID: "1f0e9d7c",
				Controller: &yes, BlockOwnerDeletion: &yes,
			}},
		},
		Spec: corev1.PodSpec{
			NodeName: "gpu-node-0001",
			Containers: []corev1.Container{{
				Name: "main", Image: "registry.example/train:1", Command: []string{"python", "train.py"},
				Env: []corev1.EnvVar{{Name: "EPOCHS", Value: "10"}, {Name: "BATCH", Value: "64"}},
				Resources: corev1.ResourceRequirements{
					Limits: corev1.ResourceList{"volcano.sh/gpu-memory": resource.MustParse("2")},
				},
				VolumeMounts: []corev1.VolumeMount{{
					Name: "kube-api-access-abcde", ReadOnly: true,
					MountPath: "/var/run/secrets/kubernetes.io/serviceaccount",
				}},
			}},
			Volumes: []corev1.Volume{{
				Name:         "kube-api-access-abcde",
				VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}},
			}},
			Tolerations: []corev1.Toleration{
				{Key: "node.kubernetes.io/not-ready", Operator: "Exists", Effect: "NoExecute"},
				{Key: "node.kubernetes.io/unreachable", Operator: "Exists", Effect: "NoExecute"},
			},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodReady, Status: "True"}, {Type: corev1.PodScheduled, Status: "True"},
				{Type: corev1.PodInitialized, Status: "True"}, {Type: corev1.ContainersReady, Status: "True"},
			},
			ContainerStatuses: []corev1.ContainerStatus{{
				Name: "main", Ready: true, Image: "registry.example/train:1",
				ImageID: "sha256:4b1f", ContainerID: "containerd://9a57",
			}},
		},
	}
}

func main() {
	if len(os.Args) > 1 {
		fmt.Fprintf(os.Stderr, "policycost takes no arguments (got %q): run it as `go run .`\n", os.Args[1:])
		os.Exit(2)
	}
	pod := runningPod()
	result := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, err := runtime.DefaultUnstructuredConverter.ToUnstructured(pod); err != nil {
				b.Fatal(err)
			}
		}
	})
	if result.N == 0 {
		fmt.Fprintln(os.Stderr, "policycost: the conversion failed")
		os.Exit(1)
	}
	perWrite := 2 * result.NsPerOp()
	fmt.Printf("a trimmed running pod to unstructured: %d ns, %d bytes, %d allocations (%d runs)\n",
		result.NsPerOp(), result.AllocedBytesPerOp(), result.AllocsPerOp(), result.N)
	fmt.Printf("per pod write, per matching policy binding (object and old copy), at least: %.1f µs\n",
		float64(perWrite)/1000)
}
