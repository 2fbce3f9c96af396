//! An eager build as one CUDA graph: the engine turns a build's three launches into one
//! `cuGraphLaunch` (on this host a kernel launch costs about as much host time as a small
//! torch op, 6–9 µs). One instantiated graph per launch geometry (a batch-size bucket;
//! at most `MAX_GRAPHS`, the least recently used evicted);
//! a call whose parameters differ from the graph's (another logits tensor, say) updates the
//! nodes in place first. When the caller's stream is being captured the engine launches
//! the kernels plainly instead, so they land in the caller's own graph.
//!
//! The decision (`GraphCache::plan`) is plain data, tested without a GPU.

use crate::device::enter_device;
use crate::{CudaError, Kernel, Params};
use cudarc::driver::sys::{self, CUgraph, CUgraphExec, CUgraphNode, CUstream};
use std::collections::HashMap;

/// One node's function (as an address), grid, block and shared memory.
type NodeShape = (usize, (u32, u32, u32), u32, usize);

/// What an instantiated graph is fixed to: each node's function and launch geometry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GraphKey(Vec<NodeShape>);

impl GraphKey {
    pub(crate) fn of(kernels: &[Kernel]) -> Self {
        Self(
            kernels
                .iter()
                .map(|k| (k.f as usize, k.grid, k.block, k.smem))
                .collect(),
        )
    }
}

/// What a call does with the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// The caller's stream is capturing: plain launches, recorded into its graph.
    Plain,
    /// No graph for this geometry yet: build and instantiate one, then launch it.
    Build,
    /// A graph exists with other parameters: update its nodes, then launch it.
    Update,
    /// A graph exists with these very parameters: launch it.
    Launch,
}

/// Graphs an engine keeps per kind (step, accept) before it evicts the least recently
/// used: a server's batch sizes (one geometry each) can outnumber what is worth keeping
/// instantiated. An evicted geometry is rebuilt on its next call.
pub const MAX_GRAPHS: usize = 64;

/// Instantiated graphs by geometry, each with the parameters its nodes hold and when it
/// was last used (a call counter), at most `cap` of them.
pub struct GraphCache<P, G> {
    entries: HashMap<GraphKey, (P, G, u64)>,
    tick: u64,
    cap: usize,
}

impl<P: PartialEq + Copy, G> Default for GraphCache<P, G> {
    fn default() -> Self {
        Self::with_cap(MAX_GRAPHS)
    }
}

#[allow(clippy::len_without_is_empty)]
impl<P: PartialEq + Copy, G> GraphCache<P, G> {
    pub fn with_cap(cap: usize) -> Self {
        Self {
            entries: HashMap::new(),
            tick: 0,
            cap: cap.max(1),
        }
    }

    /// `plain`: the caller's stream is capturing (or the engine's graphs are off).
    pub fn plan(&self, plain: bool, key: &GraphKey, params: &P) -> Action {
        match self.entries.get(key) {
            _ if plain => Action::Plain,
            None => Action::Build,
            Some((held, ..)) if held != params => Action::Update,
            Some(_) => Action::Launch,
        }
    }

    /// Holds `graph` for `key`, first evicting the least recently used graph when full.
    pub fn insert(&mut self, key: GraphKey, params: P, graph: G) {
        if self.entries.len() >= self.cap && !self.entries.contains_key(&key) {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.2)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.entries.remove(&k);
            }
        }
        self.tick += 1;
        self.entries.insert(key, (params, graph, self.tick));
    }

    pub fn remove(&mut self, key: &GraphKey) {
        self.entries.remove(key);
    }

    /// The graph of `key` and the parameters its nodes hold (a use: it becomes the most
    /// recently used).
    pub fn get_mut(&mut self, key: &GraphKey) -> Option<(&mut P, &mut G)> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(key).map(|(p, g, used)| {
            *used = tick;
            (p, g)
        })
    }

    /// Graphs held (one per launch geometry seen, at most the cap).
    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Whether `stream` is being captured into a graph right now.
pub fn is_capturing(stream: u64) -> Result<bool, CudaError> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    unsafe { sys::cuStreamIsCapturing(stream as CUstream, &mut status) }
        .result()
        .map_err(|e| CudaError::driver("cuStreamIsCapturing", e))?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// A chain of kernel nodes (each after the previous) that all take one parameter struct.
pub struct KernelGraph {
    ordinal: usize,
    graph: CUgraph,
    exec: CUgraphExec,
    nodes: Vec<CUgraphNode>,
}

// SAFETY: graph handles are plain driver handles, usable from any thread once the owning
// (primary) context is current, which every method makes it; the engine that owns them
// is used by one thread at a time (under the GIL).
unsafe impl Send for KernelGraph {}
unsafe impl Sync for KernelGraph {}

fn node_params(k: &Kernel, args: &mut Params) -> sys::CUDA_KERNEL_NODE_PARAMS {
    // SAFETY: a plain C struct; zero is a valid value of every field (null kern/ctx: the
    // function and the current context are used).
    let mut n: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    n.func = k.f;
    (n.gridDimX, n.gridDimY, n.gridDimZ) = k.grid;
    (n.blockDimX, n.blockDimY, n.blockDimZ) = (k.block, 1, 1);
    n.sharedMemBytes = k.smem as u32;
    n.kernelParams = args.as_mut_ptr();
    n
}

/// A kernel and its arguments (the driver copies their values when a node is set).
pub(crate) type Node = (Kernel, Params);

impl KernelGraph {
    /// Builds and instantiates the chain of `nodes`.
    ///
    /// # Safety
    /// The arguments' pointers address live device memory for every later launch.
    pub(crate) unsafe fn new(ordinal: usize, nodes: &mut [Node]) -> Result<Self, CudaError> {
        let (_dev, _ctx) = enter_device(ordinal)?;
        let mut graph: CUgraph = std::ptr::null_mut();
        sys::cuGraphCreate(&mut graph, 0)
            .result()
            .map_err(|e| CudaError::driver("cuGraphCreate", e))?;
        let mut g = Self {
            ordinal,
            graph,
            exec: std::ptr::null_mut(),
            nodes: Vec::with_capacity(nodes.len()),
        };
        for (k, args) in nodes.iter_mut() {
            let params = node_params(k, args);
            let mut node: CUgraphNode = std::ptr::null_mut();
            let deps = g
                .nodes
                .last()
                .map_or(std::ptr::null(), |n| n as *const CUgraphNode);
            let ndeps = usize::from(!g.nodes.is_empty());
            sys::cuGraphAddKernelNode_v2(&mut node, g.graph, deps, ndeps, &params)
                .result()
                .map_err(|e| CudaError::driver("cuGraphAddKernelNode", e))?;
            g.nodes.push(node);
        }
        sys::cuGraphInstantiateWithFlags(&mut g.exec, g.graph, 0)
            .result()
            .map_err(|e| CudaError::driver("cuGraphInstantiateWithFlags", e))?;
        Ok(g)
    }

    /// Points every node at new arguments (the geometry is unchanged).
    ///
    /// # Safety
    /// As [`KernelGraph::new`].
    pub(crate) unsafe fn update(&mut self, nodes: &mut [Node]) -> Result<(), CudaError> {
        for ((k, args), &node) in nodes.iter_mut().zip(&self.nodes) {
            let params = node_params(k, args);
            sys::cuGraphExecKernelNodeSetParams_v2(self.exec, node, &params)
                .result()
                .map_err(|e| CudaError::driver("cuGraphExecKernelNodeSetParams", e))?;
        }
        Ok(())
    }

    /// # Safety
    /// The arguments the nodes hold still address live memory.
    pub unsafe fn launch(&self, stream: u64) -> Result<(), CudaError> {
        sys::cuGraphLaunch(self.exec, stream as CUstream)
            .result()
            .map_err(|e| CudaError::driver("cuGraphLaunch", e))
    }
}

/// Runs `nodes` on `stream`: plainly when `plain` (the stream is capturing, or graphs are
/// off), else as the cached graph of their geometry — built on first use, its nodes
/// updated when `params` (the values the arguments hold) differ from the graph's.
///
/// # Safety
/// As [`KernelGraph::new`]; `params` are the values `nodes`' arguments point at.
pub(crate) unsafe fn run<P: PartialEq + Copy>(
    cache: &mut GraphCache<P, KernelGraph>,
    ordinal: usize,
    plain: bool,
    nodes: &mut [Node],
    params: P,
    stream: u64,
) -> Result<(), CudaError> {
    let kernels: Vec<Kernel> = nodes.iter().map(|n| n.0).collect();
    let key = GraphKey::of(&kernels);
    match cache.plan(plain, &key, &params) {
        Action::Plain => {
            for (k, args) in nodes.iter_mut() {
                k.launch(stream, args)?;
            }
        }
        Action::Build => {
            let g = KernelGraph::new(ordinal, nodes)?;
            g.launch(stream)?;
            cache.insert(key, params, g);
        }
        Action::Update | Action::Launch => {
            let (held, g) = cache.get_mut(&key).expect("planned from this cache");
            if *held != params {
                if let Err(e) = g.update(nodes) {
                    // Some nodes may hold the new arguments already: drop the graph rather
                    // than keep one whose nodes disagree with `held`.
                    cache.remove(&key);
                    return Err(e);
                }
                *held = params;
            }
            g.launch(stream)?;
        }
    }
    Ok(())
}

impl Drop for KernelGraph {
    fn drop(&mut self) {
        // Nothing sensible to do if this fails (the process may be tearing CUDA down).
        let _guard = enter_device(self.ordinal);
        unsafe {
            if !self.exec.is_null() {
                let _ = sys::cuGraphExecDestroy(self.exec);
            }
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(bs: u32) -> GraphKey {
        GraphKey(vec![
            (1, (bs * 15, 1, 1), 1024, 81920),
            (2, (bs, 1, 1), 512, 0),
        ])
    }

    #[test]
    fn a_capturing_stream_always_gets_plain_launches() {
        let mut c: GraphCache<u64, ()> = GraphCache::default();
        assert_eq!(c.plan(true, &key(8), &1), Action::Plain);
        c.insert(key(8), 1, ());
        assert_eq!(c.plan(true, &key(8), &1), Action::Plain);
    }

    #[test]
    fn one_graph_per_geometry_updated_when_the_parameters_change() {
        let mut c: GraphCache<u64, ()> = GraphCache::default();
        assert_eq!(c.plan(false, &key(8), &1), Action::Build);
        c.insert(key(8), 1, ());
        assert_eq!(c.plan(false, &key(8), &1), Action::Launch);
        assert_eq!(c.plan(false, &key(8), &2), Action::Update);
        assert_eq!(c.plan(false, &key(16), &1), Action::Build);
        c.insert(key(16), 1, ());
        *c.get_mut(&key(8)).unwrap().0 = 2;
        assert_eq!(c.plan(false, &key(8), &2), Action::Launch);
        assert_eq!(c.len(), 2);
        c.remove(&key(8)); // a failed update drops the graph: the next call rebuilds it
        assert_eq!(c.plan(false, &key(8), &2), Action::Build);
    }

    #[test]
    fn a_full_cache_evicts_the_least_recently_used_geometry() {
        let mut c: GraphCache<u64, u32> = GraphCache::with_cap(3);
        for bs in [1, 2, 3] {
            c.insert(key(bs), 0, bs);
        }
        c.get_mut(&key(1)); // bs 1 used again: bs 2 is now the oldest
        c.insert(key(4), 0, 4);
        assert_eq!(c.len(), 3);
        assert_eq!(c.plan(false, &key(2), &0), Action::Build);
        for bs in [1, 3, 4] {
            assert_eq!(c.plan(false, &key(bs), &0), Action::Launch, "bs {bs}");
        }
        c.insert(key(4), 1, 4); // replacing a held geometry evicts nothing
        assert_eq!(c.len(), 3);
        assert_eq!(c.plan(false, &key(3), &0), Action::Launch);
    }
}
