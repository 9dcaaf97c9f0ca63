// Command kubelet-devices is the kubelet's own device manager
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager) acting as the kubelet of one fake node.
//
// It serves kubelet.sock at the kubelet's fixed path, so the caller runs it in a private
// mount namespace with a per-node folder bound over /var/lib/kubelet/device-plugins. Device
// plugins register there; the manager runs ListAndWatch, GetPreferredAllocation, Allocate and
// builds the container run options exactly as a kubelet does. Around it, this program does
// the few kubelet jobs the tests need: it copies the manager's capacity into the Node's
// status, admits the pods bound to the node (Allocate for every container, init containers
// first), marks them Running (or Failed with UnexpectedAdmissionError, as the kubelet does),
// finishes the deletion of terminating pods, renews the node's Lease as a kubelet's heartbeat
// (so that a controller-manager's node lifecycle keeps it Ready), serves the kubelet's
// pod-resources API (its own server code; a pod is known from the start of its admission, as
// the kubelet's pod manager adds it just before admitting it), and prints one JSON line per
// outcome on stdout.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	apisgrpc "k8s.io/kubernetes/pkg/kubelet/apis/grpc"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

// outcome is one line of the program's output.
type outcome struct {
	Event     string              `json:"event"` // capacity | started | rejected | deleted
	Pod       string              `json:"pod,omitempty"`
	UID       string              `json:"uid,omitempty"`
	Container string              `json:"container,omitempty"`
	Envs      map[string]string   `json:"envs,omitempty"`
	Devices   map[string][]string `json:"devices,omitempty"`
	Message   string              `json:"message,omitempty"`
	Capacity  map[string]string   `json:"capacity,omitempty"`
	Time      string              `json:"time"`
}

var (
	outMu  sync.Mutex
	output = json.NewEncoder(os.Stdout)
)

func emit(o outcome) {
	o.Time = time.Now().UTC().Format(time.RFC3339Nano)
	outMu.Lock()
	defer outMu.Unlock()
	_ = output.Encode(o)
}

type allSourcesReady struct{}

func (allSourcesReady) AddSource(string) {}
func (allSourcesReady) AllReady() bool   { return true }

type kubelet struct {
	node     string
	client   kubernetes.Interface
	manager  *devicemanager.ManagerImpl
	pods     cache.Indexer
	queue    workqueue.TypedRateLimitingInterface[types.UID]
	byUID    sync.Map                // UID -> namespace/name
	admitted map[types.UID]admission // decided once; the status is written until it sticks
	known    knownPods               // the pod manager: pods whose admission has begun
	synced   atomic.Bool             // the pod informer has listed: active pods can be told
}

// knownPods is the kubelet's pod manager as the pod-resources API reads it: a pod is added
// just before its admission, and stays until it is deleted; one rejected or finished is not
// active.
type knownPods struct {
	mu   sync.Mutex
	pods map[types.UID]*v1.Pod
	done map[types.UID]bool
}

func (p *knownPods) add(pod *v1.Pod) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pods[pod.UID] = pod
}

func (p *knownPods) finish(uid types.UID, remove bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done[uid] = true
	if remove {
		delete(p.pods, uid)
		delete(p.done, uid)
	}
}

func (p *knownPods) GetPods() []*v1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	pods := make([]*v1.Pod, 0, len(p.pods))
	for _, pod := range p.pods {
		pods = append(pods, pod)
	}
	return pods
}

func (p *knownPods) GetActivePods() []*v1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	pods := make([]*v1.Pod, 0, len(p.pods))
	for uid, pod := range p.pods {
		if !p.done[uid] {
			pods = append(pods, pod)
		}
	}
	return pods
}

func (p *knownPods) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pod := range p.pods {
		if pod.Namespace == namespace && pod.Name == name {
			return pod, true
		}
	}
	return nil, false
}

// devices answers the pod-resources API from the device manager, as the kubelet's container
// manager does (without topology: the fake cards have none).
type devices struct {
	manager *devicemanager.ManagerImpl
	synced  *atomic.Bool
}

// UpdateAllocatedDevices frees the devices of pods no longer active, once the pod informer
// has listed them: served before, a List would free every pod's devices the checkpoint held.
func (d devices) UpdateAllocatedDevices() {
	if d.synced.Load() {
		d.manager.UpdateAllocatedDevices()
	}
}

func (d devices) GetDevices(podUID, containerName string) []*podresourcesapi.ContainerDevices {
	var held []*podresourcesapi.ContainerDevices
	for resource, instances := range d.manager.GetDevices(podUID, containerName) {
		for id := range instances {
			held = append(held, &podresourcesapi.ContainerDevices{ResourceName: resource, DeviceIds: []string{id}})
		}
	}
	return held
}

func (d devices) GetAllocatableDevices() []*podresourcesapi.ContainerDevices { return nil }

type noOtherResources struct{}

func (noOtherResources) GetCPUs(string, string) []int64                              { return nil }
func (noOtherResources) GetAllocatableCPUs() []int64                                 { return nil }
func (noOtherResources) GetMemory(string, string) []*podresourcesapi.ContainerMemory { return nil }
func (noOtherResources) GetAllocatableMemory() []*podresourcesapi.ContainerMemory    { return nil }
func (noOtherResources) GetDynamicResources(*v1.Pod, *v1.Container) []*podresourcesapi.DynamicResource {
	return nil
}

// listen opens the unix socket at socket (a stale one removed first).
func listen(socket string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		return nil, err
	}
	_ = os.Remove(socket)
	return net.Listen("unix", socket)
}

// servePodResources serves the kubelet's v1 pod-resources server, with its rate limit, on
// listener until ctx ends.
func (k *kubelet) servePodResources(ctx context.Context, listener net.Listener) {
	server := grpc.NewServer(apisgrpc.WithRateLimiter(ctx, "podresources", podresources.DefaultQPS, podresources.DefaultBurstTokens))
	providers := podresources.PodResourcesProviders{
		Pods: &k.known, Devices: devices{k.manager, &k.synced}, Cpus: noOtherResources{},
		Memory: noOtherResources{}, DynamicResources: noOtherResources{},
	}
	podresourcesapi.RegisterPodResourcesListerServer(server, podresources.NewV1PodResourcesServer(ctx, providers))
	go func() {
		<-ctx.Done()
		server.Stop()
	}()
	if err := server.Serve(listener); err != nil && ctx.Err() == nil {
		klog.Fatalf("pod-resources API: %v", err)
	}
}

// admission is the kubelet's verdict on a pod, written to its status (retried on failure).
type admission struct {
	phase   v1.PodPhase
	reason  string
	message string
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the apiserver")
	node := flag.String("node", "", "name of the Node this kubelet acts for")
	interval := flag.Duration("status-interval", time.Second, "how often capacity is copied to the Node")
	podResourcesSocket := flag.String("pod-resources-socket", "", "where to serve the pod-resources API (none if empty)")
	klog.InitFlags(nil)
	flag.Parse()
	if *node == "" || *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "kubelet-devices: --node and --kubeconfig are required")
		os.Exit(2)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("kubeconfig %s: %v", *kubeconfig, err)
	}
	config.QPS, config.Burst = 500, 1000
	client := kubernetes.NewForConfigOrDie(config)

	manager, err := devicemanager.NewManagerImpl(nil, topologymanager.NewFakeManager())
	if err != nil {
		klog.Fatalf("device manager: %v", err)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = "spec.nodeName=" + *node
		}))
	informer := factory.Core().V1().Pods().Informer()
	k := &kubelet{
		node:     *node,
		client:   client,
		manager:  manager,
		pods:     informer.GetIndexer(),
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[types.UID]()),
		admitted: map[types.UID]admission{},
		known:    knownPods{pods: map[types.UID]*v1.Pod{}, done: map[types.UID]bool{}},
	}
	enqueue := func(obj any) {
		if pod, ok := obj.(*v1.Pod); ok {
			k.byUID.Store(pod.UID, pod.Namespace+"/"+pod.Name)
			k.queue.Add(pod.UID)
		}
	}
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	})

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *podResourcesSocket != "" {
		// Served before the device manager opens its socket, as a real kubelet serves it:
		// a device plugin asks once, when it registers, whether the records can be read.
		listener, err := listen(*podResourcesSocket)
		if err != nil {
			klog.Fatalf("pod-resources API on %s: %v", *podResourcesSocket, err)
		}
		go k.servePodResources(ctx, listener)
	}
	logger := klog.Background()
	if err := manager.Start(logger, k.activePods, allSourcesReady{}, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		klog.Fatalf("device manager start: %v", err)
	}
	factory.Start(ctx.Done())
	for _, synced := range factory.WaitForCacheSync(ctx.Done()) {
		if !synced {
			return // stopped before the pods were listed
		}
	}
	k.synced.Store(true)
	go k.copyCapacity(ctx, *interval)
	go k.heartbeat(ctx)
	worker := make(chan struct{})
	go func() {
		defer close(worker)
		for k.processNext(ctx) {
		}
	}()
	<-ctx.Done()
	// As a kubelet stops: no more admissions (the one in flight ends), then the plugins go.
	k.queue.ShutDown()
	<-worker
	_ = manager.Stop(logger)
}

// activePods is what the kubelet's pod manager would answer: bound here, not finished.
func (k *kubelet) activePods() []*v1.Pod {
	var active []*v1.Pod
	for _, obj := range k.pods.List() {
		pod := obj.(*v1.Pod)
		if pod.Status.Phase != v1.PodSucceeded && pod.Status.Phase != v1.PodFailed && pod.DeletionTimestamp == nil {
			active = append(active, pod)
		}
	}
	return active
}

func (k *kubelet) copyCapacity(ctx context.Context, interval time.Duration) {
	last := ""
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		capacity, allocatable, deleted := k.manager.GetCapacity()
		status := map[string]map[string]any{"capacity": {}, "allocatable": {}}
		shown := map[string]string{}
		for name, q := range capacity {
			status["capacity"][string(name)] = q.String()
			shown[string(name)] = q.String()
		}
		for name, q := range allocatable {
			status["allocatable"][string(name)] = q.String()
			shown["allocatable/"+string(name)] = q.String()
		}
		for _, name := range deleted {
			status["capacity"][name] = nil
			status["allocatable"][name] = nil
		}
		encoded, _ := json.Marshal(map[string]any{"status": status})
		if key := string(encoded); key != last {
			_, err := k.client.CoreV1().Nodes().Patch(ctx, k.node, types.MergePatchType, encoded, metav1.PatchOptions{}, "status")
			if err == nil {
				last = key
				emit(outcome{Event: "capacity", Capacity: shown})
			} else if ctx.Err() == nil {
				klog.ErrorS(err, "copying device capacity to the node", "node", k.node)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// heartbeat renews kube-node-lease/<node> every 10 s, as the kubelet's node lease controller
// does; its first renewal creates the Lease.
func (k *kubelet) heartbeat(ctx context.Context) {
	leases := k.client.CoordinationV1().Leases(v1.NamespaceNodeLease)
	duration := int32(40)
	ticker := time.NewTicker(10 * time.Second)
	defer ticker.Stop()
	for {
		now := metav1.NewMicroTime(time.Now())
		lease, err := leases.Get(ctx, k.node, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = leases.Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: k.node, Namespace: v1.NamespaceNodeLease},
				Spec: coordinationv1.LeaseSpec{
					HolderIdentity: &k.node, LeaseDurationSeconds: &duration, RenewTime: &now,
				},
			}, metav1.CreateOptions{})
		case err == nil:
			lease.Spec.RenewTime = &now
			_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
		}
		if err != nil && ctx.Err() == nil {
			klog.ErrorS(err, "renewing the node lease", "node", k.node)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

func (k *kubelet) processNext(ctx context.Context) bool {
	uid, shutdown := k.queue.Get()
	if shutdown {
		return false
	}
	defer k.queue.Done(uid)
	if ctx.Err() != nil {
		return false // stopping: what is queued is for the next kubelet
	}
	if err := k.sync(ctx, uid); err != nil && ctx.Err() == nil {
		klog.ErrorS(err, "syncing pod", "uid", uid)
		k.queue.AddRateLimited(uid)
		return true
	}
	k.queue.Forget(uid)
	return true
}

func (k *kubelet) find(uid types.UID) *v1.Pod {
	name, ok := k.byUID.Load(uid)
	if !ok {
		return nil
	}
	obj, exists, _ := k.pods.GetByKey(name.(string))
	if !exists {
		return nil
	}
	pod := obj.(*v1.Pod)
	if pod.UID != uid {
		return nil
	}
	return pod
}

func (k *kubelet) sync(ctx context.Context, uid types.UID) error {
	pod := k.find(uid)
	if pod == nil {
		return nil
	}
	who := pod.Namespace + "/" + pod.Name
	if pod.DeletionTimestamp != nil {
		// The containers are gone at once: finish the deletion as the kubelet would.
		zero := int64(0)
		err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero, Preconditions: metav1.NewUIDPreconditions(string(uid)),
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
		k.known.finish(uid, true)
		emit(outcome{Event: "deleted", Pod: who, UID: string(uid)})
		return nil
	}
	if verdict, done := k.admitted[uid]; done {
		if pod.Status.Phase == verdict.phase {
			return nil
		}
		return k.setStatus(ctx, pod, verdict)
	}
	if pod.Status.Phase != v1.PodPending {
		return nil
	}
	// The kubelet's admission: its pod manager knows the pod from now on; the device manager
	// allocates every container, init first.
	k.known.add(pod)
	for _, containers := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range containers {
			if err := k.manager.Allocate(pod, &containers[i]); err != nil {
				if ctx.Err() != nil {
					return nil // stopping: the next kubelet admits this pod
				}
				message := fmt.Sprintf("Allocate failed due to %v, which is unexpected", err)
				emit(outcome{Event: "rejected", Pod: who, UID: string(uid), Container: containers[i].Name, Message: message})
				return k.decide(ctx, pod, admission{v1.PodFailed, "UnexpectedAdmissionError", message})
			}
		}
	}
	for _, containers := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range containers {
			options, err := k.manager.GetDeviceRunContainerOptions(ctx, pod, &containers[i])
			if err != nil {
				message := fmt.Sprintf("failed to get device run options: %v", err)
				emit(outcome{Event: "rejected", Pod: who, UID: string(uid), Container: containers[i].Name, Message: message})
				return k.decide(ctx, pod, admission{v1.PodFailed, "UnexpectedAdmissionError", message})
			}
			started := outcome{Event: "started", Pod: who, UID: string(uid), Container: containers[i].Name,
				Envs: map[string]string{}, Devices: map[string][]string{}}
			if options != nil {
				for _, env := range options.Envs {
					started.Envs[env.Name] = env.Value
				}
			}
			for resource, devices := range k.manager.GetDevices(string(uid), containers[i].Name) {
				ids := make([]string, 0, len(devices))
				for id := range devices {
					ids = append(ids, id)
				}
				sort.Strings(ids)
				started.Devices[resource] = ids
			}
			emit(started)
		}
	}
	return k.decide(ctx, pod, admission{phase: v1.PodRunning})
}

// decide records the verdict (never taken again) and writes it to the pod's status.
func (k *kubelet) decide(ctx context.Context, pod *v1.Pod, verdict admission) error {
	k.admitted[pod.UID] = verdict
	if verdict.phase == v1.PodFailed {
		k.known.finish(pod.UID, false)
	}
	return k.setStatus(ctx, pod, verdict)
}

func (k *kubelet) setStatus(ctx context.Context, pod *v1.Pod, verdict admission) error {
	now := metav1.Now()
	status := map[string]any{
		"phase": verdict.phase, "reason": verdict.reason, "message": verdict.message, "startTime": now,
	}
	if verdict.phase == v1.PodRunning {
		var statuses []map[string]any
		for _, c := range pod.Spec.Containers {
			statuses = append(statuses, map[string]any{
				"name": c.Name, "image": c.Image, "imageID": "", "ready": true, "restartCount": 0,
				"started": true, "state": map[string]any{"running": map[string]any{"startedAt": now}},
			})
		}
		status["containerStatuses"] = statuses
	}
	patch, _ := json.Marshal(map[string]any{"status": status})
	_, err := k.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
