/* The sim's model of a CUDA graph capture's topology (backend_sim_model.h),
 * as much of it as graph_capture_record_stream_reuse asks about: each
 * capturing stream has a frontier, the nodes its next work will depend on
 * (what cudaStreamGetCaptureInfo calls its dependencies); a kernel the
 * program reports on it (ta_backend_sim_use) becomes a node depending on
 * the frontier and is the frontier after it; a stream that waits for
 * another (ta_backend_sim_stream_wait, an event recorded and waited for)
 * adds the other's frontier to its own: that is how a capture forks into
 * a second stream and joins it back. Nodes are numbered from 1; a capture's
 * end drops them all. */
#include "device/backend_sim_model.h"

typedef struct sim_nodes {
  uint64_t *ids;
  size_t n, cap;
} sim_nodes;

typedef struct sim_capture_stream {
  cudaStream_t stream;
  sim_nodes frontier;
} sim_capture_stream;

typedef struct sim_graph {
  sim_nodes *deps; /* deps[i]: what node i + 1 depends on */
  size_t nnodes, cap_nodes;
  sim_capture_stream *streams;
  size_t nstreams, cap_streams;
} sim_graph;

static int nodes_add(sim_nodes *s, uint64_t id) {
  for (size_t i = 0; i < s->n; i++)
    if (s->ids[i] == id) return 0;
  if (ta_grow(&s->ids, &s->cap, s->n + 1, 4)) return -1;
  s->ids[s->n++] = id;
  return 0;
}

static sim_capture_stream *find_stream(sim_graph *g, cudaStream_t stream) {
  for (size_t i = 0; g && i < g->nstreams; i++)
    if (g->streams[i].stream == stream) return &g->streams[i];
  return NULL;
}

static sim_capture_stream *add_stream(sim_graph *g, cudaStream_t stream) {
  sim_capture_stream *c = find_stream(g, stream);
  if (c) return c;
  if (ta_grow(&g->streams, &g->cap_streams, g->nstreams + 1, 4)) return NULL;
  c = &g->streams[g->nstreams++];
  *c = (sim_capture_stream){.stream = stream};
  return c;
}

void ta_sim_graph_end(sim_device *d) {
  sim_graph *g = d->graph;
  if (!g) return;
  for (size_t i = 0; i < g->nnodes; i++) free(g->deps[i].ids);
  for (size_t i = 0; i < g->nstreams; i++) free(g->streams[i].frontier.ids);
  free(g->deps);
  free(g->streams);
  free(g);
  d->graph = NULL;
}

/* Without host memory the model forgets the capture: asking it fails, and
 * the allocator keeps such blocks until the capture ends. */
static int forget(sim_device *d) {
  ta_sim_graph_end(d);
  return -1;
}

int ta_sim_graph_begin(sim_device *d, cudaStream_t stream) {
  if (!d->graph && !(d->graph = calloc(1, sizeof *d->graph))) return -1;
  return add_stream(d->graph, stream) ? 0 : forget(d);
}

int ta_sim_graph_launch(sim_device *d, cudaStream_t stream) {
  sim_graph *g = d->graph;
  sim_capture_stream *c = find_stream(g, stream);
  if (!c) return 0; /* not capturing: nothing is recorded */
  if (ta_grow(&g->deps, &g->cap_nodes, g->nnodes + 1, 16)) return forget(d);
  g->deps[g->nnodes] = c->frontier; /* the new node depends on the frontier, which becomes just it */
  uint64_t id = ++g->nnodes;
  c->frontier = (sim_nodes){0};
  return nodes_add(&c->frontier, id) ? forget(d) : 0;
}

int ta_sim_graph_wait(sim_device *d, cudaStream_t waiter, cudaStream_t waited) {
  sim_capture_stream *from = find_stream(d->graph, waited);
  if (!from) return 0; /* waiting for work outside a capture adds nothing to it */
  size_t at = (size_t)(from - d->graph->streams);
  sim_capture_stream *to = add_stream(d->graph, waiter);
  if (!to) return forget(d);
  from = &d->graph->streams[at]; /* add_stream may have moved the array */
  for (size_t i = 0; i < from->frontier.n; i++)
    if (nodes_add(&to->frontier, from->frontier.ids[i])) return forget(d);
  return 0;
}

static int copy_out(const sim_nodes *s, uint64_t *out, size_t cap, size_t *n) {
  for (size_t i = 0; i < s->n && i < cap; i++) out[i] = s->ids[i];
  *n = s->n;
  return 0;
}

int ta_sim_capture_frontier(ta_backend *b, int device, cudaStream_t stream, uint64_t *nodes, size_t cap, size_t *n) {
  sim_device *d = &((sim_backend *)b)->dev[device];
  if (d->capturing && !d->graph) return -1; /* forgotten for want of host memory */
  sim_capture_stream *c = find_stream(d->graph, stream);
  if (!c) return 0;
  copy_out(&c->frontier, nodes, cap, n);
  return 1;
}

int ta_sim_node_dependencies(ta_backend *b, int device, uint64_t node, uint64_t *deps, size_t cap, size_t *n) {
  sim_graph *g = ((sim_backend *)b)->dev[device].graph;
  if (!g || node == 0 || node > g->nnodes) return -1;
  return copy_out(&g->deps[node - 1], deps, cap, n);
}
