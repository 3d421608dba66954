"""SABRE core: pure Python + numpy, no database imports; runs client side and in PL/Python.

One module per concept of the paper (Cao, Karras, Kalnis, Tan, VLDB J. 20(1), 2011):

========================  =================================================
``parameters``            t, k (and look-ahead): ``check_t``, ``check_k``, ``check_lookahead``
``hierarchy``             generalization hierarchies H (ARX format)
``emd``                   §3.1 ordered / hierarchical EMD, SA domain
``buckets``               §4.2 bucketCat, bucketNum, CET^U (Theorems 2, 3)
``redistribute``          §4.3 ECSize, dichotomize, bucket EMD (Theorem 4)
``hilbert``               §4.4 Hilbert keys (SABRE-AK)
``takeout``               §4.4 takeOut: AK, KNN, Hilbert-order sweep
``generalize``            EC generalization: ranges and LCAs
``metrics``               §3.2/§6 IL, AIL, closeness, discernibility, AECS
``exact_emd``             exact (integer) class EMDs: ordered, hierarchical, equal
``mondrian``              §6 baseline tMondrian (method 'mondrian'), exact EMD per cut
``refine``                t-Mondrian with a searched t-close cut (method 'refine')
``cut_search``            the candidate cuts, scored by IL, checked by the exact EMD
``partition_first``       t-Mondrian parts, SABRE-AK inside each (benchmark only)
``sabre``                 the pipeline (Algorithm 1): ``SAPlan``, ``anonymize``
``window``                §5 SABRE_W: windows, the three cases, S_G (``advance``, ``StreamRun``)
``fragments``             several SAs: the thesis's fragments (joint bucketization), sizing
``multi_sa``              several SAs, each with its own t: §7 merge, exact check and repair
``multi_refine``          'refine'/'mondrian' checking every SA; the default's guard vs t-Mondrian
``stopwatch``             ``PHASES`` and the ``Stopwatch`` that times them
``pages``                 ``small_pages``: no huge-page advice for the engine's arrays
========================  =================================================
"""
