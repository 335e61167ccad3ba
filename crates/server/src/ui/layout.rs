//! Layered left-to-right layout of a DAG (the Sugiyama method, kept small): each node goes to the
//! layer of its longest path from a root, edges that span several layers pass through virtual
//! points so they can be routed around nodes, and the order inside each layer is improved by
//! barycenter sweeps to keep crossings few. Pure: graph in, coordinates out.

/// Width and height of a node box, and the gaps between layers and between rows.
pub(crate) const NODE_WIDTH: f64 = 170.0;
pub(crate) const NODE_HEIGHT: f64 = 64.0;
const LAYER_GAP: f64 = 70.0;
const ROW_GAP: f64 = 22.0;
pub(crate) const MARGIN: f64 = 16.0;

/// Down-and-up sweeps of the barycenter heuristic.
const SWEEPS: usize = 8;

/// Where everything goes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Layout {
    /// Layer (column) of each node.
    pub(crate) layers: Vec<usize>,
    /// Top-left corner of each node's box.
    pub(crate) positions: Vec<(f64, f64)>,
    /// For each input edge, the points of its line from the right side of its source to the left
    /// side of its target (virtual points in between for long edges).
    pub(crate) routes: Vec<Vec<(f64, f64)>>,
    pub(crate) width: f64,
    pub(crate) height: f64,
}

/// A slot in a layer: a real node or a point of a long edge.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Slot {
    Node(usize),
    /// Edge index and the layer it crosses.
    Pass(usize),
}

/// Lays out `count` nodes joined by `edges` (from, to). Edges that would close a cycle or point
/// to unknown nodes are ignored (definitions are checked acyclic before they are stored).
pub(crate) fn layout(count: usize, edges: &[(usize, usize)]) -> Layout {
    let layers = assign_layers(count, edges);
    let depth = layers.iter().copied().max().map_or(0, |m| m + 1);
    let mut columns: Vec<Vec<Slot>> = vec![Vec::new(); depth];
    for node in 0..count {
        columns[layers[node]].push(Slot::Node(node));
    }
    // Each usable edge becomes a chain of slots, one per layer it touches.
    let mut chains: Vec<Option<Vec<(usize, Slot)>>> = Vec::with_capacity(edges.len());
    for (index, &(from, to)) in edges.iter().enumerate() {
        if from >= count || to >= count || layers[from] >= layers[to] {
            chains.push(None);
            continue;
        }
        let mut chain = vec![(layers[from], Slot::Node(from))];
        let (first, last) = (layers[from] + 1, layers[to]);
        for (layer, column) in columns.iter_mut().enumerate().take(last).skip(first) {
            column.push(Slot::Pass(index));
            chain.push((layer, Slot::Pass(index)));
        }
        chain.push((layers[to], Slot::Node(to)));
        chains.push(Some(chain));
    }
    order_columns(&mut columns, &chains);

    let tallest = columns.iter().map(Vec::len).max().unwrap_or(0);
    let row = NODE_HEIGHT + ROW_GAP;
    let height = MARGIN * 2.0 + (tallest as f64 * row - ROW_GAP).max(0.0);
    let width = MARGIN * 2.0 + (depth as f64 * (NODE_WIDTH + LAYER_GAP) - LAYER_GAP).max(0.0);
    let mut positions = vec![(0.0, 0.0); count];
    let mut passes: Vec<Vec<(usize, f64)>> = vec![Vec::new(); edges.len()];
    for (layer, column) in columns.iter().enumerate() {
        let x = MARGIN + layer as f64 * (NODE_WIDTH + LAYER_GAP);
        // Centre each column vertically.
        let top = MARGIN + (tallest - column.len()) as f64 * row / 2.0;
        for (rank, slot) in column.iter().enumerate() {
            let y = top + rank as f64 * row;
            match *slot {
                Slot::Node(node) => positions[node] = (x, y),
                Slot::Pass(edge) => passes[edge].push((layer, y + NODE_HEIGHT / 2.0)),
            }
        }
    }
    let routes = edges
        .iter()
        .enumerate()
        .map(|(index, &(from, to))| {
            if chains[index].is_none() {
                return Vec::new();
            }
            let (fx, fy) = positions[from];
            let (tx, ty) = positions[to];
            let mut points = vec![(fx + NODE_WIDTH, fy + NODE_HEIGHT / 2.0)];
            let mut through = passes[index].clone();
            through.sort_by_key(|&(layer, _)| layer);
            for (layer, y) in through {
                let x = MARGIN + layer as f64 * (NODE_WIDTH + LAYER_GAP);
                points.push((x, y));
                points.push((x + NODE_WIDTH, y));
            }
            points.push((tx, ty + NODE_HEIGHT / 2.0));
            points
        })
        .collect();
    Layout {
        layers,
        positions,
        routes,
        width,
        height,
    }
}

/// The longest path from a root to each node (Kahn's order); nodes on a cycle stay in layer 0
/// relative to whatever reached them.
fn assign_layers(count: usize, edges: &[(usize, usize)]) -> Vec<usize> {
    let mut incoming = vec![0usize; count];
    let mut outgoing: Vec<Vec<usize>> = vec![Vec::new(); count];
    for &(from, to) in edges {
        if from < count && to < count && from != to {
            incoming[to] += 1;
            outgoing[from].push(to);
        }
    }
    let mut layers = vec![0usize; count];
    let mut ready: Vec<usize> = (0..count).filter(|&n| incoming[n] == 0).collect();
    ready.reverse();
    while let Some(node) = ready.pop() {
        for &next in &outgoing[node] {
            layers[next] = layers[next].max(layers[node] + 1);
            incoming[next] -= 1;
            if incoming[next] == 0 {
                ready.push(next);
            }
        }
    }
    layers
}

/// Reorders each column by the mean position of its neighbours in the previous (downward sweep)
/// or next (upward sweep) column, keeping the order with the fewest crossings seen.
fn order_columns(columns: &mut [Vec<Slot>], chains: &[Option<Vec<(usize, Slot)>>]) {
    // Links between adjacent layers: (layer of left end, left slot, right slot).
    let mut links: Vec<(usize, Slot, Slot)> = Vec::new();
    for chain in chains.iter().flatten() {
        for pair in chain.windows(2) {
            links.push((pair[0].0, pair[0].1, pair[1].1));
        }
    }
    let mut best = columns.to_vec();
    let mut best_crossings = crossings(columns, &links);
    for sweep in 0..SWEEPS {
        let downward = sweep % 2 == 0;
        let layers: Vec<usize> = if downward {
            (1..columns.len()).collect()
        } else {
            (0..columns.len().saturating_sub(1)).rev().collect()
        };
        for layer in layers {
            let fixed_layer = if downward { layer - 1 } else { layer + 1 };
            let fixed = columns[fixed_layer].clone();
            let rank = |slot: &Slot| fixed.iter().position(|s| s == slot);
            let mut keyed: Vec<(f64, usize, Slot)> = columns[layer]
                .iter()
                .enumerate()
                .map(|(current, slot)| {
                    let neighbours: Vec<usize> = links
                        .iter()
                        .filter_map(|&(left_layer, left, right)| {
                            if downward && left_layer == fixed_layer && right == *slot {
                                rank(&left)
                            } else if !downward && left_layer == layer && left == *slot {
                                rank(&right)
                            } else {
                                None
                            }
                        })
                        .collect();
                    let key = if neighbours.is_empty() {
                        current as f64
                    } else {
                        neighbours.iter().sum::<usize>() as f64 / neighbours.len() as f64
                    };
                    (key, current, *slot)
                })
                .collect();
            keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            columns[layer] = keyed.into_iter().map(|(_, _, slot)| slot).collect();
        }
        let now = crossings(columns, &links);
        if now < best_crossings {
            best_crossings = now;
            best = columns.to_vec();
        }
    }
    columns.clone_from_slice(&best);
}

/// How many pairs of links between the same two layers cross.
fn crossings(columns: &[Vec<Slot>], links: &[(usize, Slot, Slot)]) -> usize {
    let rank = |layer: usize, slot: &Slot| {
        columns[layer]
            .iter()
            .position(|s| s == slot)
            .unwrap_or_default()
    };
    let ranked: Vec<(usize, usize, usize)> = links
        .iter()
        .map(|&(layer, left, right)| (layer, rank(layer, &left), rank(layer + 1, &right)))
        .collect();
    let mut count = 0;
    for (i, a) in ranked.iter().enumerate() {
        for b in &ranked[i + 1..] {
            if a.0 == b.0 && (a.1 < b.1 && a.2 > b.2 || a.1 > b.1 && a.2 < b.2) {
                count += 1;
            }
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check_layers(count: usize, edges: &[(usize, usize)], expected: &[usize]) {
        assert_eq!(layout(count, edges).layers, expected);
    }

    #[test]
    fn layers_follow_the_longest_path_from_a_root() {
        check_layers(1, &[], &[0]);
        check_layers(3, &[(0, 1), (1, 2)], &[0, 1, 2]);
        check_layers(4, &[(0, 1), (0, 2), (1, 3), (2, 3)], &[0, 1, 1, 2]);
        // The shortcut 0 → 2 does not pull 2 left of 1's successor.
        check_layers(3, &[(0, 1), (1, 2), (0, 2)], &[0, 1, 2]);
        // Steps listed in any order.
        check_layers(3, &[(2, 0), (0, 1)], &[1, 2, 0]);
    }

    #[test]
    fn edges_run_left_to_right_between_node_sides() {
        let layout = layout(2, &[(0, 1)]);
        let (a, b) = (layout.positions[0], layout.positions[1]);
        assert!(b.0 > a.0 + NODE_WIDTH);
        assert_eq!(
            layout.routes[0],
            [
                (a.0 + NODE_WIDTH, a.1 + NODE_HEIGHT / 2.0),
                (b.0, b.1 + NODE_HEIGHT / 2.0)
            ]
        );
    }

    #[test]
    fn a_long_edge_passes_through_the_layers_it_spans() {
        let layout = layout(4, &[(0, 1), (1, 2), (2, 3), (0, 3)]);
        // Source side, then in and out of layers 1 and 2, then the target side.
        assert_eq!(layout.routes[3].len(), 6);
        let xs: Vec<f64> = layout.routes[3].iter().map(|p| p.0).collect();
        assert!(xs.windows(2).all(|w| w[0] <= w[1]), "{xs:?}");
    }

    #[test]
    fn nodes_of_one_layer_do_not_overlap() {
        let edges: Vec<(usize, usize)> = (1..6).map(|n| (0, n)).collect();
        let layout = layout(6, &edges);
        let mut ys: Vec<f64> = (1..6).map(|n| layout.positions[n].1).collect();
        ys.sort_by(f64::total_cmp);
        assert!(ys.windows(2).all(|w| w[1] - w[0] >= NODE_HEIGHT));
        assert!(layout.height >= ys[4] + NODE_HEIGHT);
    }

    #[test]
    fn ordering_removes_avoidable_crossings() {
        // a→d, b→c listed so that keeping the input order would cross.
        let edges = [(0, 3), (1, 2)];
        let layout = layout(4, &edges);
        let (a, b) = (layout.positions[0].1, layout.positions[1].1);
        let (c, d) = (layout.positions[2].1, layout.positions[3].1);
        assert_eq!(a < b, d < c, "a={a} b={b} c={c} d={d}");
    }

    #[test]
    fn cycles_and_unknown_nodes_are_ignored_without_panicking() {
        let layout = layout(2, &[(0, 1), (1, 0), (0, 7)]);
        assert_eq!(layout.layers.len(), 2);
        assert!(layout.routes[2].is_empty());
    }

    #[test]
    fn an_empty_graph_has_only_margins() {
        let layout = layout(0, &[]);
        assert_eq!((layout.width, layout.height), (MARGIN * 2.0, MARGIN * 2.0));
    }
}
