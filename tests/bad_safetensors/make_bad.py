#!/usr/bin/env python3
"""Writes the crafted bad .safetensors files of tests/bad_safetensors/ and expected.txt.

Each file breaks exactly one rule of the format; expected.txt holds, per file, the
message safetensors_open must give after "<path>: " (a trailing '*' means: prefix match, used
where the tail is jansson's own wording). tests/test_safetensors.c opens every
*.safetensors here and fails on a file that has no line in expected.txt.
Run from anywhere: python3 tests/bad_safetensors/make_bad.py (stdlib only).
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
cases = []  # (name, bytes, expected message)


def st(header, data_len, hlen=None):
    """A file with the given header text and data_len zero bytes of data."""
    h = header.encode()
    n = len(h) if hlen is None else hlen
    return struct.pack('<Q', n) + h + bytes(data_len)


def add(name, blob, msg):
    cases.append((name, blob, msg))


add('empty', b'', 'file is 0 bytes, too short for the 8-byte header length')
add('truncated_length', b'\x10\x00\x00\x00\x00', 'file is 5 bytes, too short for the 8-byte header length')
add('header_len_exceeds_file', st('{}', 0, hlen=1000) + b'x' * 12,
    'header length 1000 exceeds the file size (22 bytes)')
add('huge_header_len', struct.pack('<Q', 1 << 63) + b'{}',
    'header length 9223372036854775808 exceeds the file size (10 bytes)')
add('header_len_zero', st('', 0), 'header is not valid JSON at byte *')
add('bad_json', st('{"w": {"dtype": "F32",', 0), 'header is not valid JSON at byte *')
add('duplicate_key', st('{"w":{"dtype":"U8","shape":[],"data_offsets":[0,1]},'
                        '"w":{"dtype":"U8","shape":[],"data_offsets":[1,2]}}', 2),
    'header is not valid JSON at byte *')
add('not_object', st('[1, 2]', 0), 'header is an array, expected an object')
add('tensor_not_object', st('{"w": [1]}', 0), 'tensor "w": expected an object, got an array')
add('missing_dtype', st('{"w": {"shape": [2], "data_offsets": [0, 8]}}', 8), 'tensor "w": missing "dtype"')
add('dtype_not_string', st('{"w": {"dtype": 4, "shape": [2], "data_offsets": [0, 8]}}', 8),
    'tensor "w": dtype: expected a string, got an integer')
add('unknown_dtype', st('{"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}}', 2),
    'tensor "w": unknown dtype "F8_E4M3"')
add('missing_shape', st('{"w": {"dtype": "F32", "data_offsets": [0, 8]}}', 8), 'tensor "w": missing "shape"')
add('shape_not_array', st('{"w": {"dtype": "F32", "shape": 3, "data_offsets": [0, 12]}}', 12),
    'tensor "w": shape: expected an array, got an integer')
add('negative_dim', st('{"w": {"dtype": "F32", "shape": [-1, 4], "data_offsets": [0, 16]}}', 16),
    'tensor "w": shape[0] is -1, expected >= 0')
add('dim_not_integer', st('{"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}}', 8),
    'tensor "w": shape[0]: expected an integer, got a real number')
add('too_many_dims', st('{"w": {"dtype": "U8", "shape": [1,1,1,1,1,1,1,1,1], "data_offsets": [0, 1]}}', 1),
    'tensor "w": shape has 9 dimensions, at most 8 supported')
add('shape_overflow', st('{"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], '
                         '"data_offsets": [0, 0]}}', 0),
    'tensor "w": shape [4294967296, 4294967296, 16] of F32 overflows 64 bits')
add('missing_offsets', st('{"w": {"dtype": "F32", "shape": [2]}}', 8), 'tensor "w": missing "data_offsets"')
add('offsets_wrong_count', st('{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}', 8),
    'tensor "w": data_offsets: expected an array of 2 integers, got an array of other content')
add('offsets_negative', st('{"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}}', 8),
    'tensor "w": data_offsets [-8, 0]: negative offset')
add('offsets_begin_after_end', st('{"w": {"dtype": "F32", "shape": [2], "data_offsets": [16, 8]}}', 16),
    'tensor "w": data_offsets [16, 8]: begin > end')
add('offsets_out_of_range',
    st('{"model.norm.weight": {"dtype": "F32", "shape": [160], "data_offsets": [0, 640]}}', 512),
    'tensor "model.norm.weight": data_offsets [0, 640] exceed the data section (512 bytes)')
add('truncated_data',  # a file cut short after its header: the data section is too small
    st('{"a": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]}}', 20),
    'tensor "a": data_offsets [0, 32] exceed the data section (20 bytes)')
add('shape_offset_mismatch', st('{"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}}', 24),
    'tensor "w": shape [2, 3] of F32 is 24 bytes but data_offsets [0, 20] span 20')
add('overlap', st('{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, '
                  '"b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}', 24),
    'tensors "a" [0, 16] and "b" [8, 24] overlap')
add('metadata_not_strings', st('{"__metadata__": {"format": 1}}', 0),
    '__metadata__["format"]: expected a string, got an integer')
add('metadata_not_object', st('{"__metadata__": "pt"}', 0),
    '__metadata__: expected an object of strings, got a string')
add('name_too_long', st('{"' + 'n' * 300 + '": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', 1),
    'tensor "' + 'n' * 40 + '...": name is 300 bytes, at most 255')

for f in os.listdir(HERE):
    if f.endswith('.safetensors'):
        os.unlink(os.path.join(HERE, f))
with open(os.path.join(HERE, 'expected.txt'), 'w') as out:
    out.write('# file<TAB>message after "<path>: " (trailing * = prefix match); made by make_bad.py\n')
    for name, blob, msg in cases:
        with open(os.path.join(HERE, name + '.safetensors'), 'wb') as f:
            f.write(blob)
        out.write('%s.safetensors\t%s\n' % (name, msg))
print('wrote %d bad files' % len(cases))
