"""Faults in multibody input, refused at construction with a `ValueError` that names the
body, joint or element (and for URDF the file and line) and the fix: orientations that are
not rotations, zero or non-finite joint axes, non-finite parameters and bounds, a driver's
motion of the wrong size, a mechanism without coordinates, limits and couplings of angles
measured in (−π, π], and URDF files with duplicate
names, no links, a loop of joints, text where a number belongs or no moving joint."""

import os
import tempfile

import jax.numpy as jnp
import numpy as np
import pytest

import jaxdae.multibody as mb

INERTIA = (0.1, 0.1, 0.1)


# --- bodies -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "orientation",
    [2 * np.eye(3), np.diag([1.0, 1.0, -1.0]), [[1.0, 0.1, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]],
)
def test_a_body_orientation_that_is_not_a_rotation_matrix_is_refused(orientation):
    with pytest.raises(ValueError, match=r"`orientation` of body 'a' is not a rotation matrix"):
        mb.RigidBody("a", 1.0, INERTIA, orientation=orientation)


def test_body_orientations_as_euler_parameters():
    body = mb.RigidBody("a", 1.0, INERTIA, orientation=(2.0, 0.0, 0.0, 0.0))
    np.testing.assert_allclose(body.orientation, [1.0, 0.0, 0.0, 0.0])  # normalized
    with pytest.raises(ValueError, match=r"body 'a' is the zero quaternion"):
        mb.RigidBody("a", 1.0, INERTIA, orientation=(0.0, 0.0, 0.0, 0.0))
    with pytest.raises(ValueError, match=r"`orientation` of body 'a' must be finite"):
        mb.RigidBody("a", 1.0, INERTIA, orientation=(np.nan, 0.0, 0.0, 1.0))
    c, s = np.cos(0.3), np.sin(0.3)
    rotation = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    mb.RigidBody("a", 1.0, INERTIA, orientation=rotation + 1e-9)  # within the tolerance


def test_a_marker_orientation_that_is_not_a_rotation_is_refused():
    with pytest.raises(ValueError, match=r"marker a\.p is not a rotation matrix"):
        mb.RigidBody("a", 1.0, INERTIA, {"p": (0.0, 0.0, 0.1)}, orientations={"p": 2 * np.eye(3)})


# --- joints -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda axis: mb.Revolute("ground", "a.p", axis=axis, name="hinge"),
        lambda axis: mb.Prismatic("ground", "a.p", axis=axis, name="hinge"),
        lambda axis: mb.PointOnLine("ground", "a.p", axis=axis, name="hinge"),
        lambda axis: mb.Cylindrical("ground", "a.p", axis=axis, name="hinge"),
        lambda axis: mb.Universal("ground", "a.p", axis_a=axis, name="hinge"),
        lambda axis: mb.Universal("ground", "a.p", axis_b=axis, name="hinge"),
        lambda axis: mb.Rolling("ground", "a.p", 0.1, axis=axis[:2], name="hinge"),
    ],
)
def test_a_zero_or_non_finite_joint_axis_is_refused(make):
    with pytest.raises(
        ValueError,
        match=r"`axis(_a|_b)?` of the \w+ joint 'hinge' between "
        r"'ground' and 'a\.p' is zero",
    ):
        make((0.0, 0.0, 0.0))
    with pytest.raises(
        ValueError,
        match=r"`axis(_a|_b)?` of the \w+ joint 'hinge' .* must be "
        r"finite",
    ):
        make((np.nan, np.nan, 1.0))


def test_a_tree_mechanism_refuses_a_zero_axis_at_construction():
    """The joint refuses it before the tree's coordinates turn non-finite."""
    body = mb.RigidBody("a", 1.0, INERTIA, {"p": (0.0, 0.0, 0.1)})
    with pytest.raises(
        ValueError,
        match=r"`axis` of the Revolute joint between 'ground' and "
        r"'a\.p' is zero",
    ):
        mb.TreeMechanism([body], [mb.Revolute("ground", "a.p", axis=(0.0, 0.0, 0.0))])


@pytest.mark.parametrize("value", [jnp.nan, np.inf])
def test_non_finite_joint_and_element_parameters_are_refused(value):
    cases = [
        (lambda: mb.Gear("a", "b", value), r"`ratio` of the Gear joint between 'a' and 'b'"),
        (lambda: mb.Gear("a", "b", 2.0, offset=value), r"`offset` of the Gear joint"),
        (lambda: mb.Distance("ground", "a", value), r"`length` of the Distance joint"),
        (lambda: mb.Prismatic("ground", "a", angle=value), r"`angle` of the Prismatic joint"),
        (
            lambda: mb.SpringDamper("ground", "a", stiffness=value),
            r"`stiffness` of the SpringDamper 'ground'–'a'",
        ),
        (
            lambda: mb.JointSpringDamper("pin", damping=value),
            r"`damping` of the JointSpringDamper on 'pin'",
        ),
        (lambda: mb.Gravity((value, -9.81)), r"`acceleration` of Gravity"),
        (lambda: mb.Force("a", 1.0, (value, 0.0)), r"`direction` of the Force at 'a'"),
        (lambda: mb.PlanarBody("a", 1.0, 0.1, position=(value, 0.0)), r"`position` of body 'a'"),
    ]
    for make, message in cases:
        with pytest.raises(ValueError, match=message + r".* must be finite"):
            make()


def test_joint_limit_bounds():
    with pytest.raises(
        ValueError,
        match=r"`lower` of the JointLimit of joint 'pin0' must be "
        r"finite",
    ):
        mb.JointLimit("pin0", lower=jnp.nan, upper=1.0)
    with pytest.raises(
        ValueError,
        match=r"`upper` of the JointLimit of joint 'pin0' must be "
        r"finite",
    ):
        mb.JointLimit("pin0", upper=np.inf)
    with pytest.raises(ValueError, match=r"JointLimit of joint 'pin0' exceeds its `upper`"):
        mb.JointLimit("pin0", lower=1.0, upper=-1.0)


def test_angles_measured_in_minus_pi_pi_refuse_wide_limits_and_couplings():
    """A spatial revolute joint's angle in absolute coordinates lies in (−π, π]: a limit
    beyond ±π there, or a coupling of it, is refused; in joint coordinates both hold."""
    bodies = [
        mb.RigidBody("a", 1.0, INERTIA, {"tip": (1.0, 0.0, 0.0)}),
        mb.RigidBody("b", 1.0, INERTIA, position=(1.0, 0.0, 0.0)),
    ]
    joints = [mb.Revolute("ground", "a", name="j1"), mb.Revolute("a.tip", "b", name="j2")]
    limit = [mb.JointLimit("j1", lower=-4.0, upper=1.0, name="wide")]
    coupling = [mb.JointCoupling("j2", "j1", 2.0, name="gear")]
    with pytest.raises(
        ValueError,
        match=r"JointLimit 'wide' bounds joint 'j1' beyond ±π "
        r"\(`lower` -4\).*TreeMechanism",
    ):
        mb.Mechanism(bodies, joints, stops=limit)
    with pytest.raises(
        ValueError,
        match=r"JointCoupling 'gear' couples joint 'j2'.*"
        r"TreeMechanism",
    ):
        mb.Mechanism(bodies, joints, couplings=coupling)
    tree = mb.TreeMechanism(bodies, joints, stops=limit, couplings=coupling)
    assert tree.num_equations == 1 and tree.gap_names == ("wide.lower", "wide.upper")
    with pytest.raises(ValueError, match=r"`joint` and `leader` are both 'j1'"):
        mb.JointCoupling("j1", "j1")
    with pytest.raises(
        ValueError,
        match=r"coupling 'gear' refers to joint 'missing', which is "
        r"not in the mechanism",
    ):
        mb.TreeMechanism(bodies, joints, couplings=[mb.JointCoupling("missing", "j1", name="gear")])


def _rod():
    return mb.PlanarBody("rod", 1.0, 1.0 / 12.0, {"top": (0.0, 0.5)})


@pytest.mark.parametrize("dimension", [2, 3])
def test_a_driver_motion_of_the_wrong_size_is_refused_at_construction(dimension):
    if dimension == 2:
        body, motion = _rod(), (lambda t: jnp.array([0.0, 0.0, t]))
    else:
        body, motion = (
            mb.RigidBody("rod", 1.0, INERTIA, {"top": (0.0, 0.0, 0.5)}),
            lambda t: jnp.array([0.0, t]),
        )
    with pytest.raises(
        ValueError,
        match=rf"`motion` of the joint 'drive' returns shape "
        rf"\({5 - dimension},\).* vector of {dimension} numbers",
    ):
        mb.Mechanism([body], [mb.Driver("ground", "rod.top", motion, name="drive")])


def test_a_driver_motion_of_the_right_size_is_accepted():
    for motion in (lambda t: jnp.array([t, 0.0]), lambda t: (t, 0.0)):
        mech = mb.Mechanism([_rod()], [mb.Driver("ground", "rod.top", motion)])
        q = mech.reference_coordinates()
        assert mech.constraints(0.0, q).shape == (2,)


def test_a_tree_mechanism_without_coordinates_is_refused():
    body = mb.RigidBody("a", 1.0, INERTIA)
    with pytest.raises(
        ValueError,
        match=r"TreeMechanism has no coordinates: its joints "
        r"\(\['weld'\]\)",
    ):
        mb.TreeMechanism([body], [mb.Fixed("ground", "a", name="weld")])


# --- URDF ---------------------------------------------------------------------------------

INERTIAL = (
    '<inertial><mass value="{m}"/><inertia ixx="0.1" iyy="0.1" izz="0.1" ixy="0" '
    'ixz="0" iyz="0"/></inertial>'
)


def _link(name, m="1"):
    return f'<link name="{name}">{INERTIAL.format(m=m)}</link>'


def _joint(name, parent, child, kind="revolute"):
    axis = "" if kind == "fixed" else '<axis xyz="0 0 1"/>'
    return (
        f'<joint name="{name}" type="{kind}"><parent link="{parent}"/>'
        f'<child link="{child}"/>{axis}</joint>'
    )


@pytest.fixture
def urdf():
    """Write the parts into a robot's file (a line each from line 2) and load it."""
    pytest.importorskip("yourdfpy")
    paths = []

    def load(*parts, **kwargs):
        with tempfile.NamedTemporaryFile("w", suffix=".urdf", delete=False) as file:
            file.write('<robot name="r">\n' + "\n".join(parts) + "\n</robot>\n")
        paths.append(file.name)
        return mb.load_urdf(file.name, **kwargs), file.name

    yield load
    for path in paths:
        os.unlink(path)


def _raises(match, load, *parts):
    with pytest.raises(ValueError, match=match) as info:
        load(*parts)
    return str(info.value)


def test_urdf_duplicate_links_and_joints_are_refused(urdf):
    message = _raises(
        r"lines 3 and 4: two <link>s named 'b'",
        urdf,
        '<link name="a"/>',
        _link("b"),
        _link("b", m="5"),
        _joint("j", "a", "b"),
    )
    assert message.startswith(tempfile.gettempdir())
    _raises(
        r"lines 4 and 5: two <joint>s named 'j'",
        urdf,
        '<link name="a"/>',
        _link("b"),
        _joint("j", "a", "b"),
        _joint("j", "a", "b"),
    )


def test_urdf_without_links_is_refused(urdf):
    _raises(r"\.urdf: the robot 'r' has no <link>", urdf)


def test_urdf_loop_of_joints_is_refused(urdf):
    _raises(
        r"\.urdf: the joints 'j1' \('b' → 'c', line 5\), 'j2' \('c' → 'b', line 6\) form "
        r"a loop",
        urdf,
        '<link name="a"/>',
        _link("b"),
        _link("c"),
        _joint("j1", "b", "c"),
        _joint("j2", "c", "b"),
    )


def test_urdf_text_where_a_number_belongs_is_refused(urdf):
    _raises(
        r"\.urdf, line 3: <mass value=\"abc\"> in link 'b' is not a number",
        urdf,
        '<link name="a"/>',
        _link("b", m="abc"),
        _joint("j", "a", "b"),
    )


def test_urdf_robot_without_moving_joints(urdf):
    robot, _ = urdf('<link name="a"/>', _link("b"), _joint("j", "a", "b", kind="fixed"))
    with pytest.raises(ValueError, match=r"robot 'r' has no moving joints"):
        robot.mechanism()
    assert robot.mechanism(coordinates="absolute").reference_coordinates().shape == (7,)
