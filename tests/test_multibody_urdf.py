"""URDF import: a small spatial arm from tests/data (links' inertials, continuous, revolute,
prismatic and fixed joints, limits), its forward kinematics against the chain of transforms,
a loop closed in Python, the links' visual geometry kept for the viewer, limits beyond ±π and
open on one side, `<mimic>` joints as couplings of joint coordinates, and the errors of files
that do not parse or describe no tree."""

from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae
import jaxdae.multibody as mb

pytest.importorskip("yourdfpy", reason="URDF import needs yourdfpy: pip install 'jaxdae[urdf]'")

ARM = Path(__file__).parent / "data" / "three_link_arm.urdf"
VISUAL_ARM = Path(__file__).parent / "data" / "arm_with_visuals.urdf"


@pytest.fixture(scope="module")
def robot():
    return mb.load_urdf(ARM)


def tool_position(yaw, shoulder, elbow, wrist):
    """The tool frame's origin by the chain of URDF transforms."""
    rz, ry = (
        (lambda a: mb.rotation_matrix((0, 0, 1), a)),
        (lambda a: mb.rotation_matrix((0, 1, 0), a)),
    )
    forearm = jnp.array([0.4 + wrist + 0.05, 0.0, 0.0])
    return jnp.array([0, 0, 0.1]) + rz(yaw) @ (
        jnp.array([0, 0, 0.1]) + ry(shoulder) @ (jnp.array([0, 0, 0.5]) + ry(elbow) @ forearm)
    )


@pytest.mark.slow
def test_structure_limits_and_mobility(robot):
    assert robot.name == "three_link_arm" and robot.root == "base_link"
    assert robot.joint_names == ("yaw", "shoulder", "elbow", "wrist")
    assert [b.name for b in robot.bodies] == ["ground", "turret", "upper_arm", "forearm", "slider"]
    assert robot.limits["shoulder"] == mb.UrdfLimit(-1.5, 1.5, 40.0, 2.0)
    assert robot.limits["wrist"] == mb.UrdfLimit(0.0, 0.1, 10.0, 0.5)
    assert robot.limits["yaw"] == mb.UrdfLimit(None, None, None, None)  # continuous
    forearm = robot.bodies[3]
    assert float(forearm.mass) == 1.0
    np.testing.assert_allclose(forearm.inertia, np.diag([0.0136, 0.0136, 0.0008]))
    # The massless tool link on a fixed joint is a marker of the slider.
    np.testing.assert_allclose(robot.bodies[4].markers["tool"], [0.05, 0.0, 0.0])
    model = robot.mechanism(forces=[mb.Gravity()], coordinates="absolute")
    q = model.reference_coordinates()
    assert float(jnp.max(jnp.abs(model.constraints(0.0, q)))) < 1e-15
    assert model.mobility(q) == mb.Mobility(28, 24, 4, 24, 4, 0)
    tree = robot.mechanism(forces=[mb.Gravity()])
    assert isinstance(tree, mb.TreeMechanism) and tree.coordinate_names == robot.joint_names
    assert tree.mobility() == mb.Mobility(4, 0, 4, 0, 4, 0)
    for each, at in ((model, q), (tree, tree.reference_coordinates())):
        # The forearm's inertial frame is pitched by π/2: its centre is 0.2 m along the link.
        np.testing.assert_allclose(each.marker_position(at, "forearm"), [0.2, 0.0, 0.7], atol=1e-15)
        np.testing.assert_allclose(
            each.marker_position(at, "slider.tool"), tool_position(0, 0, 0, 0), atol=1e-15
        )


@pytest.mark.slow
@pytest.mark.parametrize("coordinates", ["joint", "absolute"])
def test_forward_kinematics_of_the_joint_coordinates(robot, coordinates):
    model = robot.mechanism(coordinates=coordinates)
    angles = {"yaw": 0.3, "shoulder": 0.4, "elbow": -0.8, "wrist": 0.05}
    q0, _ = model.initial_state(joint_coordinates=angles)
    coordinates = model.joint_coordinates(q0)
    for name, value in angles.items():
        assert float(coordinates[name]) == pytest.approx(value, abs=1e-10)
    np.testing.assert_allclose(
        model.marker_position(q0, "slider.tool"), tool_position(*angles.values()), atol=1e-10
    )


@pytest.mark.slow
@pytest.mark.parametrize("coordinates", ["joint", "absolute"])
def test_loop_closed_in_python(robot, coordinates):
    """A ball joint from the tool to a ground point takes three degrees of freedom: 4 − 3
    (in joint coordinates, its three equations are the only constraints)."""
    angles = {"yaw": 0.0, "shoulder": 0.4, "elbow": -0.8, "wrist": 0.05}
    target = np.asarray(tool_position(*angles.values()))
    model = robot.mechanism(
        joints=[mb.Spherical("slider.tool", "ground.anchor", name="loop")],
        forces=[mb.Gravity()],
        ground_markers={"anchor": target},
        coordinates=coordinates,
    )
    q0, _ = robot.mechanism(coordinates=coordinates).initial_state(joint_coordinates=angles)
    assert float(jnp.max(jnp.abs(model.constraints(0.0, q0)))) < 1e-10
    n = 4 if coordinates == "joint" else 28
    assert model.mobility(q0) == mb.Mobility(n, n - 1, 1, n - 1, 1, 0)


@pytest.mark.slow
def test_urdf_arm_conserves_energy(robot):
    model = robot.mechanism(forces=[mb.Gravity()], limits=False, coordinates="absolute")
    q0, v0 = model.initial_state(
        joint_coordinates={"yaw": (0.0, 1.0), "shoulder": (0.4, 0.0), "elbow": -0.8, "wrist": 0.05}
    )
    sol = jaxdae.simulate(
        model,
        jaxdae.Baumgarte(20.0, 100.0),
        0.0,
        0.5,
        q0,
        v0,
        ts=jnp.linspace(0.0, 0.5, 6),
        rtol=1e-10,
        atol=1e-10,
    )
    energy = jax.vmap(model.energy)(sol.ts, sol.q, sol.v)
    assert float(jnp.max(jnp.abs(energy - energy[0]))) < 1e-7
    assert float(jnp.max(jnp.abs(sol.phi))) < 1e-8
    # In joint coordinates the same motion, with no constraints to keep
    tree = robot.mechanism(forces=[mb.Gravity()], limits=False)
    coordinates, rates = model.joint_coordinates(q0), model.joint_rates(q0, v0)
    tq0, tv0 = tree.initial_state(
        joint_coordinates={k: (coordinates[k], rates[k]) for k in robot.joint_names}
    )
    tree_sol = jaxdae.simulate(
        tree, jaxdae.Baumgarte(20.0, 100.0), 0.0, 0.5, tq0, tv0, ts=sol.ts, rtol=1e-10, atol=1e-10
    )
    np.testing.assert_allclose(
        tree.marker_position(tree_sol.q, "slider.tool"),
        model.marker_position(sol.q, "slider.tool"),
        atol=1e-8,
    )


def test_visuals_by_body_with_their_link_frames():
    robot = mb.load_urdf(VISUAL_ARM)
    assert mb.load_urdf(ARM).visuals == {}
    assert list(robot.visuals) == ["ground", "turret", "upper_arm", "forearm", "slider"]
    (base,) = robot.visuals["ground"]
    assert base == mb.UrdfVisual(
        "base_link",
        "ground.base_link",
        "box",
        (0.3, 0.3, 0.05),
        None,
        (1.0, 1.0, 1.0),
        (0.0, 0.0, 0.025),
        (0.0, 0.0, 0.0),
        (0.6, 0.6, 0.65, 1.0),
    )  # colour of a top-level <material>
    (turret,) = robot.visuals["turret"]
    assert (turret.kind, turret.size, turret.marker) == ("cylinder", (0.09, 0.1), "turret.frame")
    assert turret.color == (0.95, 0.5, 0.1, 1.0)
    (forearm,) = robot.visuals["forearm"]
    assert forearm.kind == "mesh" and forearm.size == ()
    assert forearm.mesh == str((VISUAL_ARM.parent / "meshes" / "forearm.stl").resolve())
    assert forearm.scale == (0.7, 0.7, 1.0)
    np.testing.assert_allclose(forearm.rpy, (0.2, np.pi / 2, 0.0), atol=1e-12)
    # The massless tool link is drawn on the slider, from its marker.
    sphere, tool = robot.visuals["slider"]
    assert (sphere.kind, sphere.size, sphere.color) == ("sphere", (0.03,), None)
    assert (tool.link, tool.marker, tool.kind) == ("tool", "slider.tool", "box")
    np.testing.assert_allclose(tool.xyz, (0.01, 0.0, 0.0))
    np.testing.assert_allclose(tool.rpy, (0.3, 0.0, 0.1), atol=1e-12)
    np.testing.assert_allclose(tool.color, (0.85, 0.15, 0.15, 0.8))


def test_package_mesh_files_resolve_up_the_tree(tmp_path):
    """`package://arm/meshes/x.stl` from `arm/urdf/arm.urdf` is `arm/meshes/x.stl`; a mesh
    found nowhere is named under the URDF file's directory."""
    (tmp_path / "arm" / "urdf").mkdir(parents=True)
    (tmp_path / "arm" / "meshes").mkdir()
    (tmp_path / "arm" / "meshes" / "x.stl").write_text("solid x\nendsolid x\n")
    mesh = '<visual><geometry><mesh filename="{}"/></geometry></visual>'
    path = tmp_path / "arm" / "urdf" / "arm.urdf"
    path.write_text(
        '<robot name="r"><link name="a">'
        + mesh.format("package://arm/meshes/x.stl")
        + mesh.format("package://arm/meshes/gone.stl")
        + "</link></robot>"
    )
    found, gone = mb.load_urdf(path).visuals["ground"]
    assert found.mesh == str(tmp_path / "arm" / "meshes" / "x.stl")
    assert gone.mesh == str(tmp_path / "arm" / "urdf" / "meshes" / "gone.stl")


def write(tmp_path, text):
    path = tmp_path / "bad.urdf"
    path.write_text(text)
    return path


LINK = (
    '<link name="{}"><inertial><mass value="1"/><inertia ixx="1" iyy="1" izz="1" ixy="0" '
    'ixz="0" iyz="0"/></inertial></link>'
)


def test_bad_urdf_files_name_file_and_line(tmp_path):
    path = write(tmp_path, '<robot name="r">\n<link name="a">\n</robot>\n')
    with pytest.raises(ValueError, match=r"bad.urdf, line \d: not a well-formed URDF"):
        mb.load_urdf(path)
    path = write(
        tmp_path,
        '<robot name="r">\n<link name="a"/>\n'
        '<joint name="j" type="revolute">\n<parent link="a"/><child link="b"/>\n'
        "</joint>\n</robot>\n",
    )
    with pytest.raises(ValueError, match=r"bad.urdf, line 3: joint 'j' names child link 'b'"):
        mb.load_urdf(path)
    path = write(
        tmp_path,
        '<robot name="r">\n<link name="a"/>\n<link name="b"/>\n'
        '<joint name="j" type="revolute">\n<parent link="a"/><child link="b"/>\n'
        "</joint>\n</robot>\n",
    )
    with pytest.raises(ValueError, match=r"bad.urdf, line 3: link 'b' has no mass"):
        mb.load_urdf(path)
    path = write(
        tmp_path,
        '<robot name="r">\n<link name="a"/>\n' + LINK.format("b") + "\n"
        '<joint name="j" type="floating">\n<parent link="a"/><child link="b"/>\n'
        "</joint>\n</robot>\n",
    )
    with pytest.raises(ValueError, match=r"line 4: joint 'j' is of type 'floating'"):
        mb.load_urdf(path)
    bad_inertia = LINK.format("b").replace('ixx="1"', 'ixx="5"')
    path = write(
        tmp_path,
        '<robot name="r">\n<link name="a"/>\n' + bad_inertia + "\n"
        '<joint name="j" type="revolute">\n<parent link="a"/><child link="b"/>\n'
        "</joint>\n</robot>\n",
    )
    with pytest.raises(ValueError, match=r"line 3: .*triangle inequality"):
        mb.load_urdf(path)
    with pytest.raises(ValueError, match="the root element is <robt>"):
        mb.load_urdf(write(tmp_path, '<robt name="r"/>\n'))
    with pytest.raises(ValueError, match="Cannot read the URDF file"):
        mb.load_urdf(tmp_path / "missing.urdf")


WIDE_HINGE = Path(__file__).parent / "data" / "wide_limit_hinge.urdf"
MIMIC = Path(__file__).parent / "data" / "mimic_pair.urdf"


def test_a_limit_beyond_pi_is_met_in_joint_coordinates_and_refused_in_absolute():
    """Joint coordinates hold the angle without wrapping, so the limit of 4 rad is met;
    absolute coordinates measure it in (−π, π] and refuse the limit, naming file, line and
    fix (the limit as data is still accepted)."""
    robot = mb.load_urdf(WIDE_HINGE)
    with pytest.raises(
        ValueError,
        match=r"wide_limit_hinge.urdf, line 12: joint 'hinge' has "
        r"the <limit> \[-4, 4\] rad, beyond ±π.*coordinates=\\?\"joint\\?\"",
    ):
        robot.mechanism(coordinates="absolute")
    assert robot.mechanism(coordinates="absolute", limits=False).stops == ()
    model = robot.mechanism()
    q0, v0 = model.initial_state(joint_coordinates={"hinge": (0.0, 8.0)})
    sol = jaxdae.simulate(model, jaxdae.Unstabilized(), 0.0, 0.6, q0, v0)
    # NumPy (eagerly, each JAX operation on a new shape compiles alone)
    assert float(np.asarray(sol.events.t)[0]) == pytest.approx(0.5, abs=1e-9)
    assert float(np.asarray(sol.q)[-1, 0]) == pytest.approx(4.0, abs=1e-9)


def test_mimic_couples_joint_coordinates():
    """`<mimic joint="j1" multiplier="2" offset="0.1"/>` on j2 is the constraint
    `θ₂ = 2 θ₁ + 0.1` of the tree: a consistent start satisfies it and the motion keeps it;
    `lower="-inf"` leaves j1's limit open below."""
    robot = mb.load_urdf(MIMIC)
    assert robot.limits["j1"][:2] == (None, 2.0)
    (coupling,) = robot.couplings
    assert (coupling.joint, coupling.leader, coupling.name) == ("j2", "j1", "j2.mimic")
    assert robot.mechanism().gap_names == ("j1.limit.upper", "j2.limit.lower", "j2.limit.upper")
    model = robot.mechanism(forces=[mb.Gravity((0.0, -9.81, 0.0))], limits=False)
    assert model.num_equations == 1
    q0, v0 = model.initial_state(joint_coordinates={"j1": (0.3, 1.0)})
    np.testing.assert_allclose(q0, [0.3, 0.7], atol=1e-12)
    np.testing.assert_allclose(v0, [1.0, 2.0], atol=1e-12)
    sol = jaxdae.simulate(
        model, jaxdae.Baumgarte(20.0, 100.0), 0.0, 0.5, q0, v0, ts=np.linspace(0.0, 0.5, 6)
    )
    q = np.asarray(sol.q)  # NumPy (eagerly, each JAX operation compiles alone)
    assert np.ptp(q[:, 0]) > 0.1  # it moves
    np.testing.assert_allclose(q[:, 1], 2 * q[:, 0] + 0.1, atol=1e-9)
    # Φ = θ₂ − m θ₁ − c reaches the coupling's numbers: ∂Φ/∂m = −θ₁ along the solution.
    grads = jax.jit(
        jax.vmap(
            lambda q: (
                eqx.filter_grad(lambda m: m.constraints(0.0, q)[0])(model).couplings[0].multiplier
            )
        )
    )(q)
    np.testing.assert_allclose(grads, -q[:, 0], atol=1e-12)


def test_mimic_in_absolute_coordinates(tmp_path):
    """Absolute coordinates refuse a revolute joint's <mimic> (its angle wraps at ±π), naming
    file, line and fix; a prismatic pair's is a constraint there as in joint coordinates."""
    with pytest.raises(
        ValueError,
        match=r"mimic_pair.urdf, line 26: joint 'j2' has a <mimic> "
        r"of joint 'j1'.*coordinates=\\?\"joint\\?\"",
    ):
        mb.load_urdf(MIMIC).mechanism(coordinates="absolute")
    path = tmp_path / "sliders.urdf"
    path.write_text(MIMIC.read_text().replace('type="revolute"', 'type="prismatic"'))
    robot = mb.load_urdf(path)
    for coordinates in ("joint", "absolute"):
        model = robot.mechanism(coordinates=coordinates)
        q0, _ = model.initial_state(joint_coordinates={"j1": 0.2})
        assert float(model.joint_coordinate("j2", q0)) == pytest.approx(0.5, abs=1e-9)


def test_bad_mimics_and_nan_limits_name_file_and_line(tmp_path):
    def joint(name, parent, child, body):
        return (
            f'<joint name="{name}" type="revolute"><parent link="{parent}"/>'
            f'<child link="{child}"/>{body}</joint>\n'
        )

    head = '<robot name="r">\n<link name="a"/>\n' + LINK.format("b") + "\n"
    path = write(tmp_path, head + joint("j", "a", "b", '<mimic joint="k"/>') + "</robot>\n")
    with pytest.raises(
        ValueError,
        match=r"bad.urdf, line 4: joint 'j' has <mimic "
        r"joint=\"k\">, which is not another moving joint",
    ):
        mb.load_urdf(path)
    path = write(
        tmp_path, head + joint("j", "a", "b", '<limit lower="nan" upper="1"/>') + "</robot>\n"
    )
    with pytest.raises(
        ValueError,
        match=r"bad.urdf, line 4: joint 'j' has <limit "
        r"lower=\"nan\">",
    ):
        mb.load_urdf(path)


SHAPES = Path(__file__).parent / "data" / "collision_shapes.urdf"


@eqx.filter_jit
def _gaps_and_markers(model, markers):
    """The gaps and the markers' positions at the reference coordinates: one program (eagerly,
    each operation of the kinematics compiles alone)."""
    q = model.reference_coordinates()
    return model.gaps(0.0, q), [model.marker_position(q, marker) for marker in markers]


def test_collision_spheres_and_boxes_become_point_contacts():
    robot = mb.load_urdf(SHAPES, fixed_base=False)
    assert [(c.marker, c.kind) for c in robot.collisions["base"]] == [
        ("base.base_collision", "box")
    ]
    assert [(c.marker, c.kind) for c in robot.collisions["leg"]] == [
        ("leg.leg_collision0", "cylinder"),
        ("leg.leg_collision1", "sphere"),
    ]
    corners = robot.contacts(["base"], friction=0.5)
    assert len(corners) == 8
    assert all(float(c.radius) == 0.0 and float(c.friction) == 0.5 for c in corners)
    model = robot.mechanism(stops=corners, limits=False)
    names = tuple(robot.collisions["base"][0].corners)
    gaps, points = _gaps_and_markers(model, names)
    # The box's corners in the global frame: its centre 0.05 above the base's origin, turned
    # by 0.5 rad about z, so their heights are 0 and 0.1.
    turn = np.asarray(jax.jit(mb.rotation_matrix)(np.array([0.0, 0.0, 1.0]), 0.5))
    signs = np.array([(sx, sy, sz) for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)])
    expected = 0.5 * signs * np.array([0.4, 0.2, 0.1]) @ turn.T + np.array([0.0, 0.0, 0.05])
    np.testing.assert_allclose(gaps, expected[:, 2], atol=1e-12)
    for point, want in zip(points, expected, strict=True):
        np.testing.assert_allclose(point, want, atol=1e-12)
    foot = mb.PlaneContact("leg.leg_collision1", radius=robot.collisions["leg"][1].size[0])
    gaps, _ = _gaps_and_markers(robot.mechanism(stops=[foot], limits=False), ())
    np.testing.assert_allclose(gaps, [-0.23], atol=1e-12)


def test_collision_shapes_that_do_not_map_are_refused_with_their_line():
    robot = mb.load_urdf(SHAPES, fixed_base=False)
    with pytest.raises(
        ValueError, match=r"collision_shapes.urdf, line 17: the <collision> cylinder"
    ):
        robot.contacts(["leg"])
    with pytest.raises(ValueError, match="no <collision> geometry.*base, leg"):
        robot.contacts(["foot"])
    with pytest.raises(ValueError, match="sequence of link names"):
        robot.contacts("base")


@pytest.mark.parametrize(
    "geometry, match",
    [
        ('<box size="0 0 0"/>', "box of link 'base' has size .*positive sides"),
        ('<box size="-0.1 0.1 0.1"/>', "box of link 'base' has size .*positive sides"),
        ('<sphere radius="-0.05"/>', "sphere of link 'base' has size .*a positive radius"),
    ],
)
def test_collision_shapes_without_positive_size_are_refused_with_their_line(
    tmp_path, geometry, match
):
    path = tmp_path / "flat.urdf"
    path.write_text(
        '<robot name="flat"><link name="base"><inertial><mass value="1"/><inertia ixx="1" '
        'iyy="1" izz="1" ixy="0" ixz="0" iyz="0"/></inertial><collision><geometry>'
        f"{geometry}</geometry></collision></link></robot>"
    )
    robot = mb.load_urdf(path, fixed_base=False)
    with pytest.raises(ValueError, match=r"flat.urdf, line 1: the <collision> " + match):
        robot.contacts(["base"])
