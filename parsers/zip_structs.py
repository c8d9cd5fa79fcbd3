"""Binary layouts of the zip format (PKWARE APPNOTE 6.3.x section numbers): records, their
signatures, field indices, flags, methods and the limits the format fixes. Constants only."""
from __future__ import annotations

import struct


# --- binary layouts (APPNOTE section numbers) ----------------------------------------------------
# 4.3.16 end of central directory record
# sig, disk, cd_disk, n_this_disk, n_total, cd_size, cd_offset, comment_len
EOCD = struct.Struct("<4s4H2LH")
MAGIC_EOCD = b"PK\x05\x06"
# 4.3.15 zip64 end of central directory locator
EOCD64_LOCATOR = struct.Struct("<4sLQL")  # sig, cd_disk, eocd64_offset, total_disks
MAGIC_EOCD64_LOCATOR = b"PK\x06\x07"
# 4.3.14 zip64 end of central directory record (fixed part)
# sig, record_size, made_by, needed, disk, cd_disk, n_this, n_total, cd_size, cd_offset
EOCD64 = struct.Struct("<4sQ2H2L4Q")
MAGIC_EOCD64 = b"PK\x06\x06"
# 4.3.12 central directory file header
CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
MAGIC_CENTRAL = b"PK\x01\x02"
(_CD_SIG, _CD_MADE_VER, _CD_MADE_SYS, _CD_NEED_VER, _CD_NEED_SYS, _CD_FLAGS, _CD_METHOD, _CD_TIME,
 _CD_DATE, _CD_CRC, _CD_CSIZE, _CD_USIZE, _CD_NAME_LEN, _CD_EXTRA_LEN, _CD_COMMENT_LEN, _CD_DISK,
 _CD_INT_ATTR, _CD_EXT_ATTR, _CD_OFFSET) = range(19)
# 4.3.7 local file header
LOCAL = struct.Struct("<4s2B4HL2L2H")
MAGIC_LOCAL = b"PK\x03\x04"
_LOCAL_UNPACK, _LOCAL_SIZE = LOCAL.unpack_from, LOCAL.size
(_LH_SIG, _LH_NEED_VER, _LH_NEED_SYS, _LH_FLAGS, _LH_METHOD, _LH_TIME, _LH_DATE, _LH_CRC,
 _LH_CSIZE, _LH_USIZE, _LH_NAME_LEN, _LH_EXTRA_LEN) = range(12)
# 4.3.9 data descriptor
MAGIC_DESCRIPTOR = b"PK\x07\x08"
# signature, crc, csize, usize: zip64 (8-byte sizes) and 4-byte sizes
_DESCRIPTORS = (struct.Struct("<4sLQQ"), struct.Struct("<4sLLL"))
EXTRA_HEADER = struct.Struct("<HH")      # id, size
EXTRA_ZIP64 = 0x0001

METHOD_STORED, METHOD_DEFLATED, METHOD_BZIP2, METHOD_LZMA = 0, 8, 12, 14
FLAG_ENCRYPTED = 0x0001
FLAG_DESCRIPTOR = 0x0008
FLAG_STRONG_ENCRYPTION = 0x0040
FLAG_UTF8 = 0x0800
FLAG_MASKED_LOCAL = 0x2000              # local header values masked (central directory encryption)
U32_MAX = 0xFFFF_FFFF
U16_MAX = 0xFFFF
MAX_COMMENT = 0xFFFF
SMALL_CRC_LIMIT = 1 << 20               # check_small_crc reads STORED members up to 1 MiB
