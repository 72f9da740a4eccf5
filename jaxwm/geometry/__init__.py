"""Camera geometry (docs/design.md §3). See each module's docstring for conventions and equations.

- ``rotations``: axis-angle, minimal z-to-ray rotation, geodesic angle, SE(3), slerp, Euler ZYX.
- ``cameras``: token rays (ViewRope Eq. 5), ViewRope rotations (Eq. 6), Plücker, PRoPE.
- ``sphere``: Fibonacci directions and field-of-view masks.
- ``warp``: projective warp with depth (ViewRope App. B, Eqs. 14-16).
- ``validate``: ``validate_cameras``.
- ``formats``: RealEstate10K and OpenGL/Blender converters.
"""

from jaxwm.geometry.cameras import (lift_intrinsics, normalized_intrinsics, pixel_centers, pixel_rays, plucker,
                                    prope_projection, reanchor, token_pixel_centers, token_rays, viewrope_rotations,
                                    world_rays)
from jaxwm.geometry.formats import (format_realestate10k, opencv_to_opengl, opengl_to_opencv,
                                    parse_blender_transforms, parse_opengl_c2w_list, parse_realestate10k)
from jaxwm.geometry.rotations import (axis_angle_to_matrix, euler_zyx_to_matrix, geodesic_angle, interpolate_poses,
                                      make_se3, matrix_to_axis_angle, matrix_to_euler_zyx, rotation_about_axis,
                                      rotation_z_to, se3_compose, se3_inverse, skew, slerp_rotation)
from jaxwm.geometry.sphere import fibonacci_sphere, fov_mask
from jaxwm.geometry.validate import validate_cameras
from jaxwm.geometry.warp import bilinear_sample, warp_coordinates, warp_frame
