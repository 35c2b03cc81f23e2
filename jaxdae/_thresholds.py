"""The size thresholds that choose between implementations of the same computation.

Each is read when a program is traced, as `_thresholds.NAME`, so that a study can change one
for a run (patch this module; clear the caches keyed on the sizes it decides, such as
`banded_plan`'s). The reason for each is given in words; the measurements that set it, with
their commands, are in the linked section of docs/design_measurements.md.
"""

# -- Small dense linear algebra (`_compilation/_linalg.py`) ----------------------------------

# Matrices up to this size are factorized by an unrolled Cholesky of elementwise operations,
# which XLA fuses, instead of LAPACK's custom calls, each a kernel of its own
# (docs/design_measurements.md#unrolled-cholesky).
UNROLL_MAX = 8

# Constraint matrices (`StructuredCholesky`) from `UNROLL_MAX + 1` up to this size are factorized
# and solved by loops of whole-vector operations (`looped_cholesky`, `looped_triangular_solve`)
# instead of LAPACK: XLA:CPU runs a while loop (an ODE solve) as one compiled kernel only
# where its body has no custom call (`_xla_flags.py`). Under `vmap` they are unrolled or
# LAPACK's batched ones (`_batched_otherwise`), and the dense mass matrices of `spd_solve`
# keep LAPACK (docs/design_measurements.md#looped-cholesky).
LOOPED_MAX = 48

# The traced Hurwitz test (`_compilation/_stability.py`) solves Lyapunov's equation in
# Kronecker form, a `d² × d²` system (`d⁴` memory, `d⁶` work): up to this size `d`. Beyond,
# the eigenvalues are computed on the host: a perturbation matrix of 81 constraints
# (`d = 162`) would otherwise take a 5.5 GB LU factorization.
LYAPUNOV_MAX = 24

# Square matrices up to this size are LU-factorized by `lu_factor` with array operations
# that XLA fuses into the surrounding kernel, instead of LAPACK's `getrf` (and two `trsm`
# per solve) as custom calls. See `lu_factor`.
LU_UNROLL_MAX = 16

# -- Linear solvers (`_compilation/_linear_solvers.py`) --------------------------------------

# Matrices on a pattern (terms derived from their structure, kept in array form) are
# factorized unrolled only up to this size, looped beyond (`cholesky_factor`): the loop's
# gradient is smaller, faster and compiles sooner, for a slightly slower solve
# (docs/design_measurements.md#array-form-unroll).
ARRAY_FORM_UNROLL_MAX = 4

# -- Sparse matrices (`_compilation/_sparse.py`) ---------------------------------------------

# Mass matrices whose connected blocks (after grouping coordinates that share an entry) are
# at most this large are inverted block by block; larger blocks keep a dense Cholesky.
BLOCK_MAX = 12

# `SparseMatrix.dense()` gathers matrices of up to this many entries, scatters larger ones:
# the matrices that a solve's right-hand side factorizes densely (`LOOPED_MAX` rows). Larger
# dense forms are not used inside a solve's loop (XLA drops them there), and a bound this low
# keeps the traced program of a structured model the same for every larger size.
GATHER_DENSE_MAX = LOOPED_MAX**2

# -- Gathers (`_compilation/_gather.py`) -----------------------------------------------------

# Padded axes up to this width are summed by adding their slices: XLA's CPU backend offloads
# a `reduce` of a few thousand rows to a library kernel with a fixed cost per call
# (docs/design_measurements.md#sliced-sums).
SLICED_SUM_MAX = 16

# -- Banded factorizations (`_compilation/_banded.py`) ---------------------------------------

# Banded factorization: for symmetric positive definite matrices whose pattern, in its own
# order or after reverse Cuthill–McKee, has a half-bandwidth `b` small against the size. On
# the CPU it runs one row (or block row) per iteration of a `lax.scan`: `O(size · b²)` work
# and a program whose size does not depend on the size of the matrix (on accelerators,
# cyclic reduction instead: `CyclicReductionFactor`).
# From 8 rows, and up to a half-bandwidth of half the size, the banded factorization is
# faster than the dense looped Cholesky, in the solve and in its gradient
# (docs/design_measurements.md#banded-factorization).
BANDED_MIN = 8  # smaller matrices keep the dense Cholesky

BANDED_MAX_RATIO = 0.5  # half-bandwidth at most this fraction of the size

# Half-bandwidths from which the CPU factorizes row by row (`BandCholeskyFactor`) rather
# than by block rows (`BandedFactor`): row by row compiles faster and its steps cost the same
# or less; a tridiagonal matrix (the chain) has its own scalar LDLᵀ (`TridiagonalFactor`),
# cheaper than either (docs/design_measurements.md#band-cholesky).
BAND_CHOLESKY_MIN_WIDTH = 2

# From this half-bandwidth the band Cholesky factorizes `BAND_CHOLESKY_ROWS_PER_STEP` rows per
# iteration of its scan, unrolled, so that XLA fuses their window updates: a step of a wide
# band's solve (the meshes) costs less, while each place that factorizes compiles to a
# larger program, a cost that narrower bands, whose solves are short, do not recoup
# (docs/design_measurements.md#band-cholesky).
BAND_CHOLESKY_UNROLL_WIDTH = 32

BAND_CHOLESKY_ROWS_PER_STEP = 4

# -- Sparse Cholesky (`_compilation/_supernodal.py`) -----------------------------------------

# Symmetric patterns of at least this many rows are considered for the multifrontal
# factorization on a nested-dissection order; smaller ones keep the dense or banded
# factorizations, whose loops cost less than the analysis and the tasks' dispatch.
SUPERNODAL_MIN = 64

# Banded patterns of a half-bandwidth below this keep the banded plan without the sparse
# analysis: nested dissection's separators would be as wide as the band, and its fronts cost
# what the band's rows do (chains, ladders, nets a few nodes wide).
SUPERNODAL_MIN_WIDTH = 16

# At most this many block-size classes of fronts: each is one branch of the factorization's
# and the substitutions' loops (compile time), and padding to fewer classes costs work.
SUPERNODAL_CLASSES = 6

# The multifrontal factorization is chosen where its estimated work (multiply–adds of its
# padded fronts, with a cost per task) times this ratio is below the banded factorization's
# `size · (b + 1)²`, or, without a banded plan, the dense one's `size³ / 3` times
# `DENSE_WORK_FACTOR`: the ratios of their measured costs per unit of estimated work on the
# CPU (docs/design_measurements.md#sparse-cholesky).
SUPERNODAL_WORK_RATIO = 2.0

DENSE_WORK_FACTOR = 0.08

# -- Trees in joint coordinates (`multibody/_tree.py`, `multibody/_articulated.py`) --------

# Trees of at least this many bodies take the recursive path: sums along paths and `M⁻¹`
# by the articulated-body algorithm, one level of bodies per step of a loop, `O(n)`;
# smaller ones keep the products with the ancestor matrix and the dense factorization of
# `M`, which their scalar graphs and fused kernels make cheaper
# (docs/design_measurements.md#articulated-bodies).
ARTICULATED_MIN_BODIES = 12

# -- Scalar graphs (`_compilation/_scalarize.py`) --------------------------------------------

# Functions with a larger array, or computing more entries in all, keep their array form:
# unrolling cost (trace time, graph size, XLA compile time) grows with the number of entries,
# while XLA's array kernels amortize their dispatch over them
# (docs/design_measurements.md#scalar-graphs).
MAX_ELEMENTS = 1024

MAX_WORK = 6_000

# The same limit for the terms evaluated outside the steps' stages (the diagnostics at the
# saved states, the contact problem at events and in the gaps' conditions), whose speed
# matters little: there a scalar graph is taken only where it compiles to no more than the
# array form (docs/design_measurements.md#event-program-copies).
OUTSIDE_STEPS_MAX_WORK = 4_000

# -- Structured terms (`_systems/_structure.py`) ---------------------------------------------

# Systems with at most this many coordinates keep the dense derivation (one batched JVP over
# `2n + 1` tangents), which the scalar-graph path (`_compilation/_scalarize.py`) turns into a
# few fused loops; larger ones derive their terms from the patterns found here, in array form
# (`array_form_scope`: a scalar graph of the structured terms is slower than their array
# form). From 10 coordinates on the structured path is the faster; at 8 the families
# disagree and the chain's dense solve decides (docs/design_measurements.md#structured-terms).
STRUCTURED_MIN = 8

# -- Multiplier solves (`_formulations/_multipliers.py`) -------------------------------------

# A constraint Jacobian denser than this is multiplied as a dense matrix.
SPARSE_MAX_DENSITY = 0.3

# -- The modified Lagrange equation (`_formulations/_modified_lagrange.py`) ------------------

# The augmented Lagrangian iterations of the equations that `jaxdae.Projected` integrates
# for a `ModifiedLagrange` formulation: each shrinks the penalty's pull off the manifold by
# about `1/(α σ)` and costs two triangular solves, or, for at most `PROJECTED_ITERATIONS`
# constraints, one column more in the solve for `q̈` (`_accelerations`).
PROJECTED_ITERATIONS = 2

# -- Rodas5P and FusedChord (`_integration/_jacobian.py`, `_linalg.factor_for_solves`) ----------

# Up to this many tangents the linearized vector field is applied to each in turn, beyond
# it to all at once with `jax.vmap`. The batched products of `vmap` (batched dot_generals,
# transposes and copies) do not fuse on the CPU, while the compiled program grows with the
# number of copies (docs/design_measurements.md#rosenbrock-tangents).
TANGENT_LOOP_MAX = 17

# From this many states `ReplayAdjoint` differentiates a Rodas5P step by its discrete adjoint
# (`_integration/_rosenbrock_adjoint.py`: the step's factorization transposed, the
# Jacobian's derivative along nine directions), below by reverse mode through the step:
# the adjoint was faster a step at 16 and 32 states, and slower at 8, where reverse mode
# through the eight Jacobian tangents costs no more than through the nine directions
# (docs/design_measurements.md#rosenbrock-step-adjoint).
ROSENBROCK_ADJOINT_MIN = 16

# Up to this many states a step turns the LU factors of `I − hγJ` into its inverse (one
# solve with the identity) and each stage's solve is a product with it, one fused
# kernel, instead of a chain of `2n` dependent substitution steps per stage: it halves the
# time per step and the compile time of a small model, with the same steps and solution
# (docs/design_measurements.md#rosenbrock-inverse). A product with the computed inverse is
# not backward stable like a substitution, but its forward error is of the same order,
# `cond(I − hγJ) · eps`, and for a dissipative `J` the inverse is bounded (`‖(I − hγJ)⁻¹‖ ≤
# 1` for a normal `J` with eigenvalues in the left half-plane); `tests/test_rosenbrock.py`
# (Robertson's problem against Radau to 1e-6, Van der Pol with μ = 10³, float32) holds
# with it. Beyond, up to `LOOPED_INVERSE_MAX` rows for a Jacobian of at most
# `TANGENT_LOOP_MAX` tangents, the inverse too (`_linalg.checked_blocked_inverse`): without a
# LAPACK call XLA runs the step loop as one kernel, faster on the 64-state spring chain,
# while for a structurally dense Jacobian (one tangent per state) that one kernel
# compiles for minutes (docs/design_measurements.md#checked-blocked-inverse). LAPACK's LU
# factors otherwise.
INVERSE_MAX = 16

# Up to this many rows `_linalg.inverse` computes an inverse by array operations (from
# `lu_factor`'s unrolled factors up to `LU_UNROLL_MAX`, by the checked block Gauss–Jordan
# elimination of `checked_blocked_inverse` beyond), LAPACK beyond. `jaxdae.GeneralizedAlpha`
# keeps its Newton matrix's inverse across iterations and steps: built from array
# operations, it adds no custom call to the solve's loop, which XLA can then run as one
# kernel (docs/design_measurements.md#looped-inverse). Larger Newton matrices of
# `GeneralizedAlpha` on a pattern (the terms carry sparse `M` and `G`) take the sparse LU
# factorization where `saddle_point_plan` estimates it cheaper than the dense one, with
# `SUPERNODAL_WORK_RATIO` and `DENSE_WORK_FACTOR` as `cholesky_plan` weighs them
# (docs/design_measurements.md#sparse-newton).
LOOPED_INVERSE_MAX = 64

# `jaxdae.GeneralizedAlpha`'s Newton matrices from `LU_UNROLL_MAX + 1` up to
# `LOOPED_INVERSE_MAX` rows are inverted by block Gauss–Jordan elimination
# (`_linalg.blocked_inverse`) in blocks of this many rows: a loop iteration of matrix products
# per block instead of one of vector operations per column, faster on the spring chain's
# and the flyball governor's matrices; 4 was the fastest of 2, 3, 4, 6 and 8 on
# both. The elimination does not pivot across blocks, which the saddle-point form of that
# matrix allows (see `blocked_inverse`); the other solvers keep the pivoted inverses
# (docs/design_measurements.md#blocked-inverse).
NEWTON_INVERSE_BLOCK = 4

# `_linalg.checked_blocked_inverse` keeps the block elimination's inverse where a probe's
# residual is at most this many times `n · eps · ‖A‖∞ ‖x‖∞`: a pivoted inverse's stayed
# below 0.4 of it, and the block elimination's below 0.03, on the matrices `I − hγJ` of
# Rodas5P's steps on the spring chain and the flyball governor; an elimination whose entries
# grow by more than about this factor falls back to partial pivoting
# (docs/design_measurements.md#checked-blocked-inverse).
INVERSE_PROBE_TOLERANCE = 16

# -- The swept solve (`_integration/_sweep_forward.py`) --------------------------------------

# Checkpoints of `RecursiveCheckpointAdjoint` where it is the default: fewer than diffrax's
# default, faster (the extra recomputation costs less than larger checkpoint buffers) and
# with less memory per trajectory, which matters under `vmap`
# (docs/design_measurements.md#checkpoints).
CHECKPOINTS = 32

# Steps per segment of `ReplayAdjoint`'s backward pass (its default `stored_steps`): every
# segment but the last is replayed twice (once to checkpoint the next segment's start, once
# to keep its states), so fewer, longer segments replay less; 4,096 steps of a state and a
# solver state of a few dozen entries are a few MB (docs/design_measurements.md#replayed-steps).
REPLAYED_STEPS = 4096

# An event-driven solve is differentiated by `ReplayAdjoint` (each stretch between events
# replayed, segments of `EVENT_REPLAYED_STEPS` steps) where its step limit is at most
# `EVENT_REPLAY_MAX_STEPS`, else through diffrax's checkpointed loop. The replay records the
# end time of each of `max_steps` steps at every stretch: past a few thousand, writing and
# reading that record costs a batch's gradient more than the checkpointed loop's
# recomputation (docs/design_measurements.md#replayed-stretches).
EVENT_REPLAY_MAX_STEPS = 4096
EVENT_REPLAYED_STEPS = 256

# -- The reverse sweep (`_integration/_sweep_backward.py`) -----------------------------------

# States of at least this many entries keep each stage's linearization in the reverse sweep
# (`_backward`). Smaller ones evaluate each stage's vector–Jacobian product as one scalar
# graph (`scalarize`), which needs the right-hand side inside it.
LINEARIZED_MIN_SIZE = 64

# Stages per iteration of the loop that applies the kept linearizations in reverse (the loop
# body holds this many copies of the right-hand side's transposed linearization): two are
# faster than one, and unrolling further costs compile time for no speed
# (docs/design_measurements.md#linearized-stages).
LINEARIZED_UNROLL = 2

# -- Projection (`_integration/_projection.py`) ----------------------------------------------

# The iterations stop once their residual is below `tol / PROJECTION_STOP`: rounding level (`10 ε`)
# for the default `tol` (`1000 ε`), which decides whether the projection succeeded. `tol`
# is relative to `1 + max|J| max|q|` (about 10 on the coupled wheels of
# `experiments/studies/work_precision.py`), so stopping at it could leave `|Φ|` above 1e-12.
PROJECTION_STOP = 100.0

# -- Diagnostics (`_integration/_diagnostics.py`) --------------------------------------------

# The constraint Jacobian's conditioning (`Solution.jacobian_conditioning`) is reported for up
# to this many constraints: an eigendecomposition of `G Gᵀ` per saved time, whose cubic cost
# beyond would exceed the solve's own on long chains.
CONDITIONING_MAX = 48

# A penalty formulation's violation (`residual_allowance`) is granted at the end of a solve only
# where the constraint Jacobian's conditioning `σ_r / σ_1` there is at least this: the
# correction that removes the residual to first order is then at most ten times the
# residual over `σ_1`. Ending nearer a singular configuration (the two-link arm stretched
# towards a target outside its workspace: 0.007; the same penalty's equilibrium inside it:
# 0.45), the residual is not the penalty's rounding (docs/failures.md).
PENALTY_CONDITIONING = 0.1

# A solve that stalls (`max_steps_reached`, `dt_min_reached`) where the constraint
# Jacobian's conditioning has fallen below this is reported as stalled near singular
# constraints: the steps shrink towards a configuration where the constraints degenerate
# (a pendulum whose prescribed length reaches zero stalls at a conditioning of 0.05 after
# 500 steps, 0.0025 after 10,000), and more steps do not help. Far from such a place a
# stalled solve's conditioning is of order one.
STALL_CONDITIONING = 0.1
